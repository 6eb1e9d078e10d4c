"""Which API failures the backend retries (5xx, 429, timeouts, connection errors) and which it raises at once."""

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from scheduler.backend_factory import kubernetes_backend
from scheduler.backends.k8s_api import KubernetesUnavailable

pytestmark = pytest.mark.fast


@pytest.fixture
def backend(settings, tmp_path):
    settings.JOBSITE_K8S_API_RETRIES = 3
    settings.JOBSITE_K8S_API_RETRY_BASE_SECONDS = 0.001
    return kubernetes_backend(api_client=object(), namespace="ns", log_root=tmp_path)


def flaky(*failures):
    calls = []

    def fn(*args, **kwargs):
        calls.append(kwargs)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return "ok"

    return fn, calls


@pytest.mark.parametrize("error", [
    ApiException(status=500), ApiException(status=503), ApiException(status=429),
    urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out"),
    urllib3.exceptions.ProtocolError("connection reset"),
    ConnectionRefusedError(),
], ids=["500", "503", "429", "read-timeout", "protocol", "refused"])
def test_transient_errors_are_retried(backend, error):
    fn, calls = flaky(error, error)
    assert backend._call(fn) == "ok"
    assert len(calls) == 3
    assert calls[0]["_request_timeout"] == (10, 60)  # every call has a timeout


@pytest.mark.parametrize("status", [400, 403, 404, 409, 422])
def test_client_errors_are_raised_at_once(backend, status):
    fn, calls = flaky(ApiException(status=status))
    with pytest.raises(ApiException) as raised:
        backend._call(fn)
    assert raised.value.status == status and len(calls) == 1


def test_retries_run_out(backend):
    fn, calls = flaky(*[ApiException(status=502)] * 10)
    with pytest.raises(KubernetesUnavailable, match="502"):
        backend._call(fn)
    assert len(calls) == 4  # the call and 3 retries
