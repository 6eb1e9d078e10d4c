"""Fixtures of the Kubernetes backend tests: the emulator (tests/k8s/emulator.py), a kubeconfig, a kubelet.

The backend talks to kmock's KubernetesEmulator over HTTP with the real ``kubernetes`` client; the tests play the
kubelet by patching pod status, and every watch is stopped before the emulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client

from tests import waiting

from .emulator import EmulatorServer, kubeconfig

NAMESPACE = "jobsite-test"
IMAGE = {"image": "jupyter/base-notebook:latest", "imageID": ""}


@pytest.fixture
def emulator():
    from scheduler.backends.kubernetes import KubernetesBackend

    server = EmulatorServer().start()
    yield server
    for backend in list(KubernetesBackend.instances):  # every watch ends before the server does
        backend.close()
    server.stop()


@pytest.fixture
def core(emulator) -> client.CoreV1Api:
    return client.CoreV1Api(emulator.api_client())


@pytest.fixture
def k8s(settings, emulator, tmp_path, monkeypatch):
    """JOBSITE_BACKEND=kubernetes with a kubeconfig pointing at the emulator, as a deployment would have it."""
    from scheduler.backend_factory import get_backend

    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig(emulator.url))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings.JOBSITE_BACKEND = "kubernetes"
    settings.JOBSITE_K8S_NAMESPACE = NAMESPACE
    settings.JOBSITE_LOG_ROOT = tmp_path / "logs"
    settings.JOBSITE_K8S_API_RETRY_BASE_SECONDS = 0.01
    settings.JOBSITE_K8S_IMAGE_PULL_GRACE_SECONDS = 120
    settings.JOBSITE_K8S_LOG_REFRESH_SECONDS = 0
    settings.JOBSITE_K8S_LOG_WORKERS = 0  # log copies inline: a test reads the archive right after a sync
    settings.JOBSITE_K8S_LOG_REQUESTS_PER_SECOND = 0  # no budget: every sync reads every due log
    settings.JOBSITE_K8S_CHECK_CAPACITY = False
    get_backend.cache_clear()
    emulator.tmp_logs = tmp_path / "logs"
    yield emulator
    get_backend.cache_clear()


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    """tests/waiting.py's wait_for, polling every 10 ms, in the call form these tests use."""
    return waiting.wait_for(predicate, timeout=timeout, interval=0.01, message=what)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Kubelet:
    """Plays the kubelet: patches pod status through the API, as the real one does."""

    core: client.CoreV1Api
    namespace: str = NAMESPACE
    node: str = "gpu-node-1"
    started: dict[str, datetime] = field(default_factory=dict)

    def patch(self, name: str, status: dict) -> None:
        self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status}, _preload_content=False)

    def _base(self, name: str, phase: str, ago: float = 0) -> dict:
        start = self.started.setdefault(name, datetime.now(UTC) - timedelta(seconds=ago))
        return {
            "phase": phase,
            "startTime": iso(start),
            "hostIP": "10.0.0.1",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
        }

    def schedule(self, name: str) -> None:
        self.core.patch_namespaced_pod(name, self.namespace, {"spec": {"nodeName": self.node}},
                                       _preload_content=False)

    def waiting(self, name: str, reason: str, message: str = "", ago: float = 0) -> None:
        self.patch(name, {**self._base(name, "Pending", ago), "containerStatuses": [
            {"name": "main", **IMAGE, "ready": False, "restartCount": 0, "state": {"waiting": {"reason": reason,
                                                                                      "message": message}}}]})

    def running(self, name: str) -> None:
        self.patch(name, {**self._base(name, "Running"), "containerStatuses": [
            {"name": "main", **IMAGE, "ready": True, "restartCount": 0,
             "state": {"running": {"startedAt": iso(datetime.now(UTC))}}}]})

    def exited(self, name: str, code: int = 0, reason: str | None = None, finished_at: datetime | None = None) -> None:
        self.patch(name, {**self._base(name, "Succeeded" if code == 0 else "Failed"), "containerStatuses": [
            {"name": "main", **IMAGE, "ready": False, "restartCount": 0, "state": {"terminated": {
                "exitCode": code, "reason": reason or ("Completed" if code == 0 else "Error"),
                "finishedAt": iso(finished_at or datetime.now(UTC))}}}]})


@pytest.fixture
def kubelet(core) -> Kubelet:
    return Kubelet(core)


@pytest.fixture
def run_hooks(django_capture_on_commit_callbacks):
    """Run after-commit side effects (launch, stop) as production does, inside the test transaction."""

    def run(fn, *args, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return fn(*args, **kwargs)

    return run
