"""`make run` with JOBSITE_BACKEND=kubernetes against the API emulator: a job submitted in the browser becomes a
pod asking for its GPUs, follows the pod to SUCCEEDED, keeps its log after the pod is gone; cancel deletes pods.

The test plays the kubelet by patching pod status through the API, as in tests/k8s.
"""

import os
from datetime import UTC, datetime

import pytest
from kubernetes import client

from tests.browser import chromium
from tests.k8s.emulator import EmulatorServer, kubeconfig
from tests.waiting import wait_for

from .api import call
from .servers import make_server

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

NAMESPACE = "jobsite-e2e"
IMAGE = {"image": "jupyter/base-notebook:latest", "imageID": ""}


@pytest.fixture
def cluster(tmp_path):
    emulator = EmulatorServer().start()
    config = tmp_path / "kubeconfig"
    config.write_text(kubeconfig(emulator.url))
    try:
        with make_server("run", tmp_path / "var", JOBSITE_BACKEND="kubernetes", KUBECONFIG=str(config),
                         JOBSITE_K8S_NAMESPACE=NAMESPACE, JOBSITE_K8S_LOG_REFRESH_SECONDS="0") as base:
            yield base, emulator, client.CoreV1Api(emulator.api_client())
    finally:
        emulator.stop()


def wait(predicate, timeout=30.0, what="condition"):
    """tests/waiting.py's wait_for, polling every 0.2 s, in the call form these tests use."""
    return wait_for(predicate, timeout=timeout, interval=0.2, message=what)


def pod_names(core):
    return {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}


def kubelet(core, name, phase, state, code=None):
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    container = {"name": "main", **IMAGE, "ready": phase == "Running", "restartCount": 0, "state": state}
    core.patch_namespaced_pod_status(name, NAMESPACE, {"status": {
        "phase": phase, "startTime": now, "hostIP": "10.0.0.1", "containerStatuses": [container],
        "conditions": [{"type": "PodScheduled", "status": "True"}]}}, _preload_content=False)


def test_browser_submission_runs_as_a_gpu_pod_and_keeps_its_log(cluster):
    base, emulator, core = cluster
    with chromium() as browser:
        page = browser.new_page()
        page.goto(base + "/login/")
        page.fill("input[name=username]", "bob")
        page.fill("input[name=password]", "smoke-pass")
        page.click("button[type=submit]")
        page.goto(base + "/jobs/new/")
        page.select_option("select[name=instance_type]", "gpu-2")
        page.fill("textarea[name=command]", "python train.py")
        page.fill("input[name=name]", "on-the-cluster")
        page.click("button:has-text('Submit job')")
        page.wait_for_url("**/jobs/*/")
        job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

    token = call(base, "POST", "/api/v1/auth/token/", {"username": "bob", "password": "smoke-pass"})["token"]
    name = f"job-{job_id}-1-0"
    wait(lambda: name in pod_names(core), what="the pod")
    pod = core.read_namespaced_pod(name, NAMESPACE)
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"
    assert pod.metadata.labels["app.kubernetes.io/managed-by"] == "jobsite"

    kubelet(core, name, "Running", {"running": {"startedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}})
    wait(lambda: call(base, "GET", f"/api/v1/jobs/{job_id}/", token=token)["phase"] == "RUNNING", what="RUNNING")
    emulator.emu.logs[(NAMESPACE, name)] = "epoch 1 loss 0.5\n"
    kubelet(core, name, "Succeeded", {"terminated": {"exitCode": 0, "reason": "Completed"}})
    job = wait(lambda: (j := call(base, "GET", f"/api/v1/jobs/{job_id}/", token=token))["phase"] == "SUCCEEDED"
               and j, what="SUCCEEDED")
    assert job["color"] == "#0000ff" and "Completed" in [e["reason"] for e in job["events"]]

    core.delete_namespaced_pod(name, NAMESPACE)  # as the TTL or a node drain would
    emulator.emu.logs.pop((NAMESPACE, name), None)
    assert "epoch 1 loss 0.5" in call(base, "GET", f"/api/v1/jobs/{job_id}/logs/", token=token)


def test_cancelled_job_leaves_no_pod(cluster):
    base, emulator, core = cluster
    token = call(base, "POST", "/api/v1/auth/token/", {"username": "bob", "password": "smoke-pass"})["token"]
    job = call(base, "POST", "/api/v1/jobs/", {"group": "phusers", "image": "base-notebook",
                                               "instance_type": "gpu-1", "command": "sleep 600"}, token=token)
    name = f"job-{job['id']}-1-0"
    wait(lambda: name in pod_names(core), what="the pod")
    kubelet(core, name, "Running", {"running": {"startedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}})
    call(base, "POST", f"/api/v1/jobs/{job['id']}/cancel/", {}, token=token)
    wait(lambda: name not in pod_names(core), what="the pod to be deleted")
    job = wait(lambda: (j := call(base, "GET", f"/api/v1/jobs/{job['id']}/", token=token))["phase"] == "CANCELLED"
               and j, what="CANCELLED")
    assert job["status"] == "Cancelled"
    assert os.environ.get("KUBECONFIG") is None  # the server got its kubeconfig, the tests' process did not
