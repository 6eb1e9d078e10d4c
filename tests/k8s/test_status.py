"""Every pod state the backend maps: a table from pod status to (state, status, reason, exit code)."""

from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client

from scheduler.backends.k8s_status import observe_pod
from scheduler.values import ReplicaState as S

pytestmark = pytest.mark.fast

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
GRACE = 120


def ts(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(phase="Pending", main=None, inits=None, reason=None, message=None, started=10, node="node-a",
        conditions=None, restart="Never", deleting=False, last=None):
    status = {"phase": phase, "startTime": ts(started)}
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    if main is not None:
        c = {"name": "main", "state": main}
        if last:
            c["lastState"] = last
        status["containerStatuses"] = [c]
    if inits is not None:
        status["initContainerStatuses"] = [{"name": f"init-{i}", "state": s} for i, s in enumerate(inits)]
    if conditions is not None:
        status["conditions"] = conditions
    meta = {"name": "job-1-1-0", "creationTimestamp": ts(started)}
    if deleting:
        meta["deletionTimestamp"] = ts(0)
    return {"metadata": meta, "spec": {"nodeName": node, "restartPolicy": restart}, "status": status}


def waiting(reason, message=""):
    return {"waiting": {"reason": reason, "message": message}}


def terminated(code, reason="Error", message=""):
    return {"terminated": {"exitCode": code, "reason": reason, "message": message}}


RUNNING = {"running": {"startedAt": ts(5)}}
DONE = terminated(0, "Completed")

CASES = [
    # id, pod, (state, status, reason, exit_code)
    ("pending-unscheduled", pod(node=None, conditions=[{"type": "PodScheduled", "status": "False",
                                                         "reason": "Unschedulable",
                                                         "message": "0/3 nodes: insufficient nvidia.com/gpu"}]),
     (S.STARTING, "Pending", "", None)),
    ("pending-nothing-yet", pod(node=None), (S.STARTING, "Pending", "", None)),
    ("pending-scheduled", pod(), (S.STARTING, "ContainerCreating", "", None)),
    ("container-creating", pod(main=waiting("ContainerCreating")), (S.STARTING, "ContainerCreating", "", None)),
    ("init-0-of-2", pod(inits=[RUNNING, waiting("PodInitializing")], main=waiting("PodInitializing")),
     (S.STARTING, "Init:0/2", "", None)),
    ("init-1-of-2", pod(inits=[DONE, RUNNING], main=waiting("PodInitializing")), (S.STARTING, "Init:1/2", "", None)),
    ("init-waiting-to-start", pod(inits=[waiting("PodInitializing")]), (S.STARTING, "Init:0/1", "", None)),
    ("pod-initializing", pod(inits=[DONE, DONE], main=waiting("PodInitializing")),
     (S.STARTING, "PodInitializing", "", None)),
    ("init-error-retrying", pod(inits=[terminated(2)], main=waiting("PodInitializing"), restart="Always"),
     (S.STARTING, "Init:Error", "", None)),
    ("init-error-pod-failed", pod("Failed", inits=[terminated(3)], main=waiting("PodInitializing")),
     (S.EXITED, "Init:Error", "", 3)),
    ("init-crashloop", pod(inits=[waiting("CrashLoopBackOff")], restart="Always"),
     (S.STARTING, "Init:CrashLoopBackOff", "", None)),
    ("init-image-pull", pod(inits=[waiting("ErrImagePull")]), (S.STARTING, "Init:ErrImagePull", "", None)),
    ("init-image-pull-past-grace", pod(inits=[waiting("ImagePullBackOff")], started=GRACE + 1),
     (S.FAILED, "Init:ImagePullBackOff", "FailedImagePull", None)),
    ("err-image-pull", pod(main=waiting("ErrImagePull", "manifest unknown")), (S.STARTING, "ErrImagePull", "", None)),
    ("image-pull-backoff", pod(main=waiting("ImagePullBackOff")), (S.STARTING, "ImagePullBackOff", "", None)),
    ("image-pull-at-grace", pod(main=waiting("ImagePullBackOff"), started=GRACE),
     (S.STARTING, "ImagePullBackOff", "", None)),
    ("err-image-pull-past-grace", pod(main=waiting("ErrImagePull", "manifest unknown"), started=GRACE + 1),
     (S.FAILED, "ErrImagePull", "FailedImagePull", None)),
    ("image-pull-backoff-past-grace", pod(main=waiting("ImagePullBackOff"), started=600),
     (S.FAILED, "ImagePullBackOff", "FailedImagePull", None)),
    ("invalid-image-name", pod(main=waiting("InvalidImageName")),
     (S.FAILED, "InvalidImageName", "FailedImagePull", None)),
    ("create-container-error", pod(main=waiting("CreateContainerError", "no command")),
     (S.FAILED, "CreateContainerError", "ContainerCannotRun", None)),
    ("run-container-error", pod(main=waiting("RunContainerError")),
     (S.FAILED, "RunContainerError", "ContainerCannotRun", None)),
    ("config-error-in-grace", pod(main=waiting("CreateContainerConfigError", 'secret "x" not found')),
     (S.STARTING, "CreateContainerConfigError", "", None)),
    ("config-error-past-grace", pod(main=waiting("CreateContainerConfigError"), started=GRACE + 1),
     (S.FAILED, "CreateContainerConfigError", "ContainerCannotRun", None)),
    ("container-cannot-run", pod("Failed", main=terminated(128, "ContainerCannotRun", "exec: bash: not found")),
     (S.FAILED, "ContainerCannotRun", "ContainerCannotRun", None)),
    ("start-error", pod("Failed", main=terminated(128, "StartError")),
     (S.FAILED, "ContainerCannotRun", "ContainerCannotRun", None)),
    ("running", pod("Running", main=RUNNING), (S.RUNNING, "", "", None)),
    ("running-no-container-status", pod("Running"), (S.RUNNING, "", "", None)),
    ("crashloop", pod("Running", main=waiting("CrashLoopBackOff"), last=terminated(1), restart="Always"),
     (S.RUNNING, "CrashLoopBackOff", "", None)),
    ("restarting-after-exit", pod("Running", main=terminated(1), restart="Always"),
     (S.RUNNING, "CrashLoopBackOff", "", None)),
    ("succeeded", pod("Succeeded", main=DONE), (S.EXITED, "", "", 0)),
    ("succeeded-no-container-status", pod("Succeeded"), (S.EXITED, "", "", 0)),
    ("failed-exit-3", pod("Failed", main=terminated(3)), (S.EXITED, "", "", 3)),
    ("terminated-while-phase-running", pod("Running", main=terminated(0, "Completed")), (S.EXITED, "", "", 0)),
    ("oom-killed", pod("Failed", main=terminated(137, "OOMKilled")), (S.EXITED, "OOMKilled", "", 137)),
    ("failed-no-container-status", pod("Failed"), (S.EXITED, "", "", 1)),
    ("deadline-exceeded", pod("Failed", main=terminated(137), reason="DeadlineExceeded",
                              message="Pod was active on the node longer than the specified deadline"),
     (S.EXITED, "DeadlineExceeded", "", 137)),
    ("evicted", pod("Failed", reason="Evicted", message="The node was low on resource: memory."),
     (S.FAILED, "Evicted", "Evicted", None)),
    ("evicted-with-container", pod("Failed", main=terminated(137), reason="Evicted"),
     (S.FAILED, "Evicted", "Evicted", None)),
    ("unknown-node-lost", pod("Unknown", main=RUNNING), (S.LOST, "Unknown", "", None)),
    ("node-lost-reason", pod("Running", main=RUNNING, reason="NodeLost"), (S.LOST, "Unknown", "", None)),
    ("terminating-running", pod("Running", main=RUNNING, deleting=True), (S.RUNNING, "Terminating", "", None)),
    ("terminating-starting", pod(main=waiting("ContainerCreating"), deleting=True),
     (S.STARTING, "Terminating", "", None)),
    ("terminating-but-exited", pod("Succeeded", main=DONE, deleting=True), (S.EXITED, "", "", 0)),
    ("vanished", None, (S.LOST, "", "", None)),
]


@pytest.mark.parametrize("pod_json, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_status_mapping(pod_json, expected):
    obs = observe_pod(pod_json, rank=0, name="job-1-1-0", now=NOW, image_pull_grace=GRACE)
    assert (obs.state, obs.status, obs.reason, obs.exit_code) == expected
    assert obs.rank == 0


def test_messages_explain_the_state():
    def message(p):
        return observe_pod(p, rank=0, name="job-1-1-0", now=NOW, image_pull_grace=GRACE).message

    assert message(None) == "pod job-1-1-0 vanished"
    assert "node-a" in message(pod("Unknown", main=RUNNING))
    assert "unresponsive" in message(pod("Unknown", main=RUNNING))
    assert message(pod(main=waiting("ErrImagePull", "manifest unknown"), started=999)) == "manifest unknown"
    assert "insufficient nvidia.com/gpu" in message(pod(node=None, conditions=[
        {"type": "PodScheduled", "status": "False", "message": "0/3 nodes: insufficient nvidia.com/gpu"}]))
    assert message(pod("Failed", reason="Evicted", message="low on memory")) == "low on memory"
    assert "exited with code 1" in message(pod("Running", main=waiting("CrashLoopBackOff"), last=terminated(1)))
    assert message(pod("Failed", inits=[terminated(3)])) == "init container init-0 exited with code 3"


def test_a_client_model_pod_maps_like_its_json():
    model = client.V1Pod(
        metadata=client.V1ObjectMeta(name="job-1-1-0"),
        spec=client.V1PodSpec(containers=[client.V1Container(name="main")], node_name="n", restart_policy="Never"),
        status=client.V1PodStatus(
            phase="Pending", start_time=NOW - timedelta(seconds=GRACE + 30),
            container_statuses=[client.V1ContainerStatus(
                name="main", image="x", image_id="", ready=False, restart_count=0,
                state=client.V1ContainerState(waiting=client.V1ContainerStateWaiting(reason="ImagePullBackOff")))],
        ),
    )
    obs = observe_pod(model, rank=2, name="job-1-1-2", now=NOW, image_pull_grace=GRACE)
    assert (obs.rank, obs.state, obs.reason) == (2, S.FAILED, "FailedImagePull")
    assert observe_pod(model, rank=2, name="job-1-1-2", now=NOW, image_pull_grace=GRACE + 60).state == S.STARTING


def test_when_the_container_started_comes_with_the_observation():
    started = NOW - timedelta(seconds=5)
    assert observe_pod(pod("Running", RUNNING), rank=0, name="p", now=NOW).started_at == started
    done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": ts(5), "finishedAt": ts(1)}}
    seen = observe_pod(pod("Succeeded", done), rank=0, name="p", now=NOW)
    assert (seen.started_at, seen.finished_at) == (started, NOW - timedelta(seconds=1))
    assert observe_pod(pod("Pending", waiting("ContainerCreating")), rank=0, name="p", now=NOW).started_at is None
