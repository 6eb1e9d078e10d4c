"""The Kubernetes API as the backend calls it: the client's configuration, and calls retried on transient errors.

Transient: 5xx, 429 and network errors, retried with doubling backoff (at least a 429/503's Retry-After); any other
API error is raised at once. Every failure is counted in the scheduler's metrics by verb and code.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from scheduler import metrics

from .base import BackendUnavailable

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = (10, 60)  # connect, read (seconds)


class KubernetesUnavailable(BackendUnavailable):
    """The API server kept failing (5xx, 429, network) through every retry."""


def load_api_client() -> client.ApiClient:
    """The in-cluster service account inside a pod, else KUBECONFIG (or ~/.kube/config)."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        # Read KUBECONFIG now (the client reads it once, at import); it may list several files.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None, client_configuration=configuration)
    # urllib3 would wait out a Retry-After (429/503) inside the request, in the caller's thread: the backend's own
    # retries decide instead (and never in the admission thread).
    configuration.retries = urllib3.Retry(total=2, status=0, redirect=0, respect_retry_after_header=False)
    return client.ApiClient(configuration)


def log_api_client(api: client.ApiClient) -> client.ApiClient:
    """A client like ``api`` (same cluster, credentials, headers) with a pool of its own whose urllib3 never
    retries on a status: its default Retry sleeps out a 429/503's Retry-After inside the request."""
    configuration = copy.deepcopy(api.configuration)
    configuration.retries = urllib3.Retry(total=2, connect=2, read=0, redirect=0, status=0, other=0,
                                          status_forcelist=(), respect_retry_after_header=False,
                                          raise_on_status=False, backoff_factor=0)
    own = client.ApiClient(configuration)
    own.default_headers.update(api.default_headers)
    return own


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in (0, None, 429) or exc.status >= 500
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


def retry_after(exc: BaseException, cap: float = 60.0) -> float:
    """Seconds a 429/503 answer asks us to wait (its Retry-After header, in seconds), else 0."""
    headers = getattr(exc, "headers", None) or {}
    try:
        return min(float(headers.get("Retry-After", 0)), cap)
    except (TypeError, ValueError):
        return 0.0


def api_message(exc: ApiException) -> str:
    """The Status message of an API error, else its reason."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    return str(body.get("message") or exc.reason or exc.status)


def parse_quantity(value: Any) -> float:
    from kubernetes.utils import parse_quantity as parse

    return float(parse(str(value)))


def call(fn: Callable[..., Any], *args: Any, retries: int, retry_base: float, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, retrying transient failures ``retries`` times with doubling backoff from
    ``retry_base`` seconds; other errors are raised at once, and a transient one still there at the end as
    ``KubernetesUnavailable``."""
    kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
    delay = retry_base
    for attempt in range(retries + 1):
        try:
            return fn(*args, **kwargs)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            metrics.api_error(getattr(fn, "__name__", str(fn)), metrics.api_error_code(exc))
            if not is_transient(exc):
                raise
            if attempt == retries:
                raise KubernetesUnavailable(f"{getattr(fn, '__name__', fn)}: {describe(exc)}") from exc
            wait = max(delay, retry_after(exc))
            log.warning("Kubernetes API %s failed (%s); retry %d/%d in %.1f s", getattr(fn, "__name__", fn),
                        describe(exc), attempt + 1, retries, wait)
            time.sleep(wait)
            delay = min(delay * 2, 30.0)
    raise AssertionError("unreachable")


def describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"
