"""What a pod says about its replica: a pure function from a pod (dict or V1Pod) and the time to an observation.

The fine statuses are the ones ``kubectl get pods`` and Run:ai show (ContainerCreating, Init:1/2, ErrImagePull,
CrashLoopBackOff, OOMKilled, Terminating, ...); the coarse state tells the sync what to do with the job.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from scheduler.values import ReplicaObservation, ReplicaState

from .k8s_manifest import CONTAINER

S = ReplicaState

# Waiting reasons of an image that cannot be pulled (yet): shown while the kubelet retries, fatal after a grace.
PULL_RETRYING = frozenset({"ErrImagePull", "ImagePullBackOff"})
# Image problems no retry fixes.
PULL_FATAL = frozenset({"InvalidImageName", "ErrImageNeverPull"})
# The container runtime could not create or start the container.
CANNOT_RUN_WAITING = frozenset({"CreateContainerError", "RunContainerError", "ContainerCannotRun"})
CANNOT_RUN_TERMINATED = frozenset({"ContainerCannotRun", "StartError"})
# Usually a missing Secret/ConfigMap: may be fixed by an admin, so it gets the same grace as an image pull.
CONFIG_WAITING = frozenset({"CreateContainerConfigError"})
# The pod condition DisruptionTarget: the cluster is ending the pod, through no fault of the job (what the Job
# controller's podFailurePolicy reads).
DISRUPTIONS = {
    "PreemptionByScheduler": "preempted by the cluster's scheduler",
    "TerminationByKubelet": "terminated by the kubelet (node shutdown or pressure)",
    "EvictionByEvictionAPI": "evicted through the Eviction API (node drain)",
    "DeletionByTaintManager": "deleted from a tainted node",
    "DeletionByPodGC": "deleted by the pod garbage collector (its node is gone)",
}
# A pod the kubelet refused at admission: the node could not give it its devices (a GPU plugin out of step).
ADMISSION_ERRORS = frozenset({"UnexpectedAdmissionError"})


def as_dict(pod: Any) -> dict | None:
    """A pod as the API's JSON (camelCase keys), whether given as a dict or a kubernetes client model."""
    if pod is None or isinstance(pod, dict):
        return pod
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(pod)


def parse_time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    try:
        return parse_datetime(str(value))
    except ValueError:
        return None


def _main(statuses: list[dict]) -> dict:
    return next((c for c in statuses if c.get("name") == CONTAINER), statuses[0] if statuses else {})


def _condition(status: dict, kind: str) -> dict | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)


def observe_pod(pod: Any, *, rank: int, name: str, now: datetime, image_pull_grace: float = 120,
                lost_nodes: Mapping[str, str] | None = None,
                known_nodes: Collection[str] | None = None) -> ReplicaObservation:
    """The state of one replica from its pod; ``pod`` None means the pod is gone.

    ``lost_nodes``: nodes NotReady or tainted unreachable/not-ready (name: why); ``known_nodes``: every node that
    exists (None or empty: not known). A pod whose Ready condition is False or Unknown on a lost node is lost (the
    node lifecycle controller sets that condition, never the phase, and no kubelet confirms its deletion); one whose
    node no longer exists holds nothing.
    """
    pod = as_dict(pod)
    if pod is None:
        return ReplicaObservation(rank, S.LOST, message=f"pod {name} vanished", gone=True)
    obs = replace(_observe(pod, rank, name, now, image_pull_grace), present=True)
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    if deleting and obs.state in (S.STARTING, S.RUNNING):
        obs = replace(obs, status="Terminating")
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName") or ""
    ready = _condition(status, "Ready") or {}
    if node and obs.state in (S.STARTING, S.RUNNING) and ready.get("status") in ("False", "Unknown"):
        if known_nodes and node not in known_nodes:
            obs = replace(obs, state=S.LOST, status="Unknown", present=False, gone=True,
                          message=f"node {node} running pod {name} is gone")
        elif node in (lost_nodes or {}):
            obs = replace(obs, state=S.LOST, status="Unknown",
                          message=f"node {node} running pod {name} is unreachable ({lost_nodes[node]})"
                          + ("; the pod is stuck terminating" if deleting else ""))
    if not obs.disruption and (cause := disruption_cause(status)):
        obs = replace(obs, disruption=cause)
    return obs


def disruption_cause(status: dict) -> str:
    """Why the cluster ends the pod through no fault of the job, from its DisruptionTarget condition; "" if not."""
    target = _condition(status, "DisruptionTarget")
    if target is None or target.get("status") != "True":
        return ""
    reason = target.get("reason") or ""
    return DISRUPTIONS.get(reason, f"disrupted by the cluster ({reason or 'DisruptionTarget'})")


def node_suspect(pod: Any) -> bool:
    """A pod placed on a node, not ended, its Ready condition False or Unknown: is its node alive?"""
    pod = as_dict(pod)
    if not pod or not (pod.get("spec") or {}).get("nodeName"):
        return False
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return False
    return (_condition(status, "Ready") or {}).get("status") in ("False", "Unknown")


def _eviction(message: str, node: str) -> str:
    """The cause of an eviction: node pressure (a disruption) or "" when the pod went over its own limits."""
    match = re.search(r"low on resource: ([\w./-]+)", message)
    if match:
        return f"evicted: node {match.group(1).rstrip('.')} pressure"
    if "exceed" in message:  # over its own ephemeral-storage limit: the job's fault
        return ""
    return f"evicted from {node}" + (f": {message}" if message else "")


def _observe(pod: dict, rank: int, name: str, now: datetime, grace: float) -> ReplicaObservation:
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    phase = status.get("phase") or "Pending"
    pod_reason = status.get("reason") or ""
    pod_message = status.get("message") or ""
    node = spec.get("nodeName") or "its node"

    if pod_reason == "Evicted":
        return ReplicaObservation(rank, S.FAILED, status="Evicted", reason="Evicted",
                                  message=pod_message or f"pod {name} was evicted from {node}",
                                  disruption=disruption_cause(status) or _eviction(pod_message, node))
    if phase == "Failed" and (pod_reason in ADMISSION_ERRORS or pod_reason.startswith("OutOf")):
        return ReplicaObservation(rank, S.FAILED, status=pod_reason, reason=pod_reason,
                                  message=pod_message or f"pod {name} was refused by {node}",
                                  disruption=f"refused by {node} at admission ({pod_reason})"
                                  + (f": {pod_message}" if pod_message else ""))
    if phase == "Unknown" or pod_reason == "NodeLost":
        return ReplicaObservation(rank, S.LOST, status="Unknown",
                                  message=f"node {node} running pod {name} is unresponsive"
                                  + (f": {pod_message}" if pod_message else ""))

    started = parse_time(status.get("startTime")) or parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    stuck_for = (now - started).total_seconds() if started else 0.0

    def pull(waiting: dict, prefix: str = "") -> ReplicaObservation:
        reason = waiting.get("reason") or ""
        message = waiting.get("message") or ""
        if reason in PULL_FATAL or stuck_for > grace:
            return ReplicaObservation(rank, S.FAILED, status=prefix + reason, reason="FailedImagePull",
                                      message=message or f"pod {name} could not pull its image")
        return ReplicaObservation(rank, S.STARTING, status=prefix + reason, message=message)

    # Init containers run one after the other before the main one; a native sidecar (an init container with
    # restartPolicy Always) counts as done once started, and runs on beside it, as the kubelet has it.
    inits = status.get("initContainerStatuses") or []
    sidecars = {c.get("name") for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"}
    done = 0
    for c in inits:
        state = c.get("state") or {}
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if c.get("name") in sidecars and (terminated is not None or (state.get("running") is not None
                                                                    and c.get("started") is not False)):
            done += 1  # started (or stopped with the pod at its end)
            continue
        if terminated is not None:
            if terminated.get("exitCode", 1) == 0:
                done += 1
                continue
            message = terminated.get("message") or f"init container {c.get('name')} exited with code " \
                                                   f"{terminated.get('exitCode')}"
            if phase == "Failed":
                return ReplicaObservation(rank, S.EXITED, exit_code=terminated.get("exitCode", 1),
                                          status="Init:Error", message=message)
            return ReplicaObservation(rank, S.STARTING, status="Init:Error", message=message)
        if waiting is not None:
            reason = waiting.get("reason") or ""
            if reason in PULL_RETRYING or reason in PULL_FATAL:
                return pull(waiting, "Init:")
            if reason == "CrashLoopBackOff":
                return ReplicaObservation(rank, S.STARTING, status="Init:CrashLoopBackOff",
                                          message=waiting.get("message") or "")
            if reason in CANNOT_RUN_WAITING:
                return ReplicaObservation(rank, S.FAILED, status=f"Init:{reason}", reason="ContainerCannotRun",
                                          message=waiting.get("message") or reason)
        return ReplicaObservation(rank, S.STARTING, status=f"Init:{done}/{len(inits)}")

    main = _main(status.get("containerStatuses") or [])
    state = main.get("state") or {}
    terminated, waiting, running = state.get("terminated"), state.get("waiting"), state.get("running")

    if terminated is not None:
        code = terminated.get("exitCode")
        reason = terminated.get("reason") or ""
        message = terminated.get("message") or ""
        if reason in CANNOT_RUN_TERMINATED:
            return ReplicaObservation(rank, S.FAILED, status="ContainerCannotRun", reason="ContainerCannotRun",
                                      message=message or f"pod {name} could not start its container ({reason})")
        if spec.get("restartPolicy") == "Always" and phase not in ("Succeeded", "Failed"):
            # An interactive replica between two runs: the kubelet restarts it in place.
            return ReplicaObservation(rank, S.RUNNING, status="CrashLoopBackOff" if code else "Completed",
                                      message=f"exited with code {code}; restarting")
        shown = "OOMKilled" if reason == "OOMKilled" else pod_reason if pod_reason == "DeadlineExceeded" else ""
        return ReplicaObservation(rank, S.EXITED, exit_code=1 if code is None else code, status=shown,
                                  message=message or pod_message, finished_at=parse_time(terminated.get("finishedAt")),
                                  started_at=parse_time(terminated.get("startedAt")))

    if waiting is not None:
        reason = waiting.get("reason") or ""
        message = waiting.get("message") or ""
        if reason in PULL_RETRYING or reason in PULL_FATAL:
            return pull(waiting)
        if reason in CANNOT_RUN_WAITING:
            return ReplicaObservation(rank, S.FAILED, status=reason, reason="ContainerCannotRun",
                                      message=message or reason)
        if reason in CONFIG_WAITING:
            if stuck_for > grace:
                return ReplicaObservation(rank, S.FAILED, status=reason, reason="ContainerCannotRun",
                                          message=message or reason)
            return ReplicaObservation(rank, S.STARTING, status=reason, message=message)
        if reason == "CrashLoopBackOff":
            last = (main.get("lastState") or {}).get("terminated") or {}
            detail = f"exited with code {last['exitCode']}; " if last.get("exitCode") is not None else ""
            return ReplicaObservation(rank, S.RUNNING, status="CrashLoopBackOff",
                                      message=f"{detail}{message or 'back-off restarting the container'}")
        if phase in ("Succeeded", "Failed"):
            pass  # ended before its container ran: decided by the phase below
        else:
            return ReplicaObservation(rank, S.STARTING, status=reason or "ContainerCreating", message=message)

    if running is not None and phase not in ("Succeeded", "Failed"):
        return ReplicaObservation(rank, S.RUNNING, started_at=parse_time(running.get("startedAt")))
    if phase == "Succeeded":
        return ReplicaObservation(rank, S.EXITED, exit_code=0)
    if phase == "Failed":
        return ReplicaObservation(rank, S.EXITED, exit_code=1, status=pod_reason if pod_reason else "",
                                  message=pod_message or f"pod {name} failed")
    if phase == "Running":
        return ReplicaObservation(rank, S.RUNNING)

    # Pending with nothing started yet: waiting for a node, or being set up on one.
    scheduled = _condition(status, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False":
        return ReplicaObservation(rank, S.STARTING, status="Pending",
                                  message=scheduled.get("message") or scheduled.get("reason") or "")
    if spec.get("nodeName") or (scheduled is not None and scheduled.get("status") == "True"):
        return ReplicaObservation(rank, S.STARTING, status="ContainerCreating")
    return ReplicaObservation(rank, S.STARTING, status="Pending")
