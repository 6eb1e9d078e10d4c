"""Pod shapes a real cluster produces and an emulator does not by itself: a dead node (Ready False, the node tainted
unreachable, the pod stuck terminating), disruptions (DisruptionTarget, admission errors, node-pressure evictions)
and native sidecars. Pure: observe_pod and node_health on the API's JSON."""

from datetime import UTC, datetime, timedelta

import pytest

from scheduler.backends.k8s_nodes import node_health
from scheduler.backends.k8s_status import node_suspect, observe_pod
from scheduler.values import ReplicaState as S

pytestmark = pytest.mark.fast

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LOST = {"gpu-a": "tainted node.kubernetes.io/unreachable"}
KNOWN = {"gpu-a", "gpu-b"}


def ts(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(phase="Running", main=None, ready="True", node="gpu-a", deleting=False, reason=None, message=None,
        disruption=None, inits=None, init_specs=None):
    conditions = [{"type": "PodScheduled", "status": "True"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready})
    if disruption:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": disruption})
    status = {"phase": phase, "startTime": ts(60), "conditions": conditions}
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    if main is not None:
        status["containerStatuses"] = [{"name": "main", "state": main}]
    if inits is not None:
        status["initContainerStatuses"] = inits
    meta = {"name": "job-1-1-0", "creationTimestamp": ts(60)}
    if deleting:
        meta["deletionTimestamp"] = ts(0)
    spec = {"nodeName": node, "restartPolicy": "Never", "initContainers": init_specs or []}
    return {"metadata": meta, "spec": spec, "status": status}


RUNNING = {"running": {"startedAt": ts(50)}}
WAITING = {"waiting": {"reason": "PodInitializing"}}


def killed(code):
    return {"terminated": {"exitCode": code, "reason": "Error"}}


SIDECAR = [{"name": "istio-proxy", "restartPolicy": "Always"}]

CASES = [
    # id, pod, (state, status, present, gone, disruption)
    # --- a dead node: the node lifecycle controller sets Ready False/Unknown, never the phase ---
    ("ready-false-on-unreachable-node", pod(main=RUNNING, ready="False"),
     (S.LOST, "Unknown", True, False, "")),
    ("ready-unknown-on-unreachable-node", pod(main=RUNNING, ready="Unknown"),
     (S.LOST, "Unknown", True, False, "")),
    ("stuck-terminating-on-unreachable-node", pod(main=RUNNING, ready="False", deleting=True),
     (S.LOST, "Unknown", True, False, "")),
    ("not-ready-on-a-healthy-node: still running", pod(main=RUNNING, ready="False", node="gpu-b"),
     (S.RUNNING, "", True, False, "")),
    ("ready-on-a-tainted-node: trusted while its kubelet says so", pod(main=RUNNING),
     (S.RUNNING, "", True, False, "")),
    ("no-ready-condition-on-a-tainted-node: nothing to go on", pod(main=RUNNING, ready=None),
     (S.RUNNING, "", True, False, "")),
    ("its-node-deleted: holds nothing", pod(main=RUNNING, ready="False", node="gpu-gone", deleting=True),
     (S.LOST, "Unknown", False, True, "")),
    ("ended-on-a-lost-node: its end stands", pod("Succeeded", main=killed(0), ready="False"),
     (S.EXITED, "", True, False, "")),
    # --- disruptions: the Job controller's podFailurePolicy reads DisruptionTarget ---
    ("preempted-by-scheduler", pod("Failed", main=killed(137), ready="False", disruption="PreemptionByScheduler"),
     (S.EXITED, "", True, False, "preempted by the cluster's scheduler")),
    ("terminated-by-kubelet", pod("Failed", main=killed(143), ready="False", disruption="TerminationByKubelet"),
     (S.EXITED, "", True, False, "terminated by the kubelet (node shutdown or pressure)")),
    ("eviction-api-while-terminating", pod(main=RUNNING, deleting=True, disruption="EvictionByEvictionAPI"),
     (S.RUNNING, "Terminating", True, False, "evicted through the Eviction API (node drain)")),
    ("taint-manager-on-lost-node", pod(main=RUNNING, ready="False", deleting=True,
                                       disruption="DeletionByTaintManager"),
     (S.LOST, "Unknown", True, False, "deleted from a tainted node")),
    # --- GPU admission errors: the node refused the pod, the job is not at fault ---
    ("unexpected-admission-error", pod("Failed", ready=None, reason="UnexpectedAdmissionError",
                                       message="Allocate failed due to no healthy devices present"),
     (S.FAILED, "UnexpectedAdmissionError", True, False,
      "refused by gpu-a at admission (UnexpectedAdmissionError): Allocate failed due to no healthy devices present")),
    ("out-of-gpu", pod("Failed", ready=None, reason="OutOfnvidia.com/gpu"),
     (S.FAILED, "OutOfnvidia.com/gpu", True, False, "refused by gpu-a at admission (OutOfnvidia.com/gpu)")),
    # --- evictions: node pressure is a disruption, going over its own limits is not ---
    ("evicted-memory-pressure", pod("Failed", ready="False", reason="Evicted",
                                    message="The node was low on resource: memory. Threshold quantity: 100Mi."),
     (S.FAILED, "Evicted", True, False, "evicted: node memory pressure")),
    ("evicted-disk-pressure", pod("Failed", ready="False", reason="Evicted",
                                  message="The node was low on resource: ephemeral-storage."),
     (S.FAILED, "Evicted", True, False, "evicted: node ephemeral-storage pressure")),
    ("evicted-over-its-own-limit", pod("Failed", ready="False", reason="Evicted",
                                       message="Pod ephemeral local storage usage exceeds the total limit"),
     (S.FAILED, "Evicted", True, False, "")),
    # --- native sidecars: done for init once started, never holding the job back ---
    ("sidecar-starting", pod("Pending", ready="False", main=WAITING, init_specs=SIDECAR, node="gpu-b",
                             inits=[{"name": "istio-proxy", "started": False, "state": RUNNING}]),
     (S.STARTING, "Init:0/1", True, False, "")),
    ("sidecar-started-main-running", pod(main=RUNNING, init_specs=SIDECAR,
                                         inits=[{"name": "istio-proxy", "started": True, "state": RUNNING}]),
     (S.RUNNING, "", True, False, "")),
    ("sidecar-started-main-creating", pod("Pending", ready="False", node="gpu-b", init_specs=SIDECAR,
                                          main={"waiting": {"reason": "ContainerCreating"}},
                                          inits=[{"name": "istio-proxy", "started": True, "state": RUNNING}]),
     (S.STARTING, "ContainerCreating", True, False, "")),
    ("sidecar-after-a-plain-init", pod("Pending", ready="False", main=WAITING, node="gpu-b",
                                       init_specs=[{"name": "fetch"}, *SIDECAR],
                                       inits=[{"name": "fetch", "state": killed(0)},
                                              {"name": "istio-proxy", "started": True, "state": RUNNING}]),
     (S.STARTING, "PodInitializing", True, False, "")),
    ("sidecar-killed-at-the-end", pod("Succeeded", ready="False", main=killed(0), init_specs=SIDECAR,
                                      inits=[{"name": "istio-proxy", "state": killed(137)}]),
     (S.EXITED, "", True, False, "")),
]


@pytest.mark.parametrize("pod_json, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_real_pod_shapes(pod_json, expected):
    obs = observe_pod(pod_json, rank=0, name="job-1-1-0", now=NOW, lost_nodes=LOST, known_nodes=KNOWN)
    assert (obs.state, obs.status, obs.present, obs.gone, obs.disruption) == expected


def test_a_lost_node_is_named_in_the_message():
    obs = observe_pod(pod(main=RUNNING, ready="False", deleting=True), rank=0, name="job-1-1-0", now=NOW,
                      lost_nodes=LOST, known_nodes=KNOWN)
    assert obs.message == ("node gpu-a running pod job-1-1-0 is unreachable (tainted node.kubernetes.io/unreachable);"
                           " the pod is stuck terminating")


@pytest.mark.parametrize("known", [None, set()])
def test_without_node_knowledge_a_pod_not_ready_is_not_lost(known):
    """The nodes could not be read (no permission, API down) or none are listed: never taken for lost, nor gone."""
    obs = observe_pod(pod(main=RUNNING, ready="False"), rank=0, name="job-1-1-0", now=NOW, known_nodes=known)
    assert obs.state == S.RUNNING


@pytest.mark.parametrize("pod_json, suspect", [
    (pod(main=RUNNING), False),
    (pod(main=RUNNING, ready="False"), True),
    (pod(main=RUNNING, ready="Unknown", deleting=True), True),
    (pod(main=RUNNING, deleting=True), False),  # Ready still True: its kubelet is finishing it
    (pod(main=RUNNING, ready=None), False),  # no Ready condition (yet): nothing to go on
    (pod("Pending", node=None, ready=None), False),
    (pod("Succeeded", main=killed(0), ready="False"), False),
])
def test_only_pods_not_ready_or_deleting_make_the_nodes_be_read(pod_json, suspect):
    assert node_suspect(pod_json) is suspect


def node(name, ready="True", taints=()):
    return {"metadata": {"name": name}, "spec": {"taints": [{"key": k, "effect": "NoExecute"} for k in taints]},
            "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "NodeStatusUnknown"}]}}


def test_node_health_reads_ready_and_the_lifecycle_taints():
    health = node_health([
        node("ok"), node("unreachable", "Unknown", ["node.kubernetes.io/unreachable"]),
        node("tainted-only", taints=["node.kubernetes.io/not-ready"]), node("other-taint", taints=["gpu=broken"]),
    ])
    assert health.known == {"ok", "unreachable", "tainted-only", "other-taint"}
    assert health.lost == {"unreachable": "Ready Unknown: NodeStatusUnknown",
                           "tainted-only": "tainted node.kubernetes.io/not-ready"}
