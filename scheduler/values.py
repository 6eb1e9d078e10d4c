"""The value types shared by the pure decisions and the backends: a node, what to launch, what was observed.

Plain frozen data with no behaviour beyond a property or two: the decisions (core, reconcile, estimate) read them,
the backends build or return them, and neither imports the other's module for them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class Node:
    """A node's allocatable and free resources; a resource it does not list is not limited by it."""

    name: str
    allocatable: dict[str, int]
    free: dict[str, int]
    free_gpu_ids: list[int] | None = None


class ReplicaState(enum.StrEnum):
    STARTING = "starting"  # created, not running yet (status may say why: ContainerCreating, ErrImagePull, ...)
    RUNNING = "running"
    EXITED = "exited"  # ended with exit_code
    FAILED = "failed"  # cannot run at all (status/reason: FailedImagePull, ContainerCannotRun, Evicted, ...)
    LOST = "lost"  # its supervisor/node stopped reporting and left no exit code


@dataclass(frozen=True)
class ReplicaObservation:
    rank: int
    state: ReplicaState
    exit_code: int | None = None
    status: str = ""  # fine status to show, e.g. "ImagePullBackOff", "Init:1/2"; empty: the phase's default
    reason: str = ""  # for FAILED: the job's failure reason, e.g. "FailedImagePull"
    message: str = ""
    # Something of it still holds its node's resources: a pod until it is deleted (even one whose container
    # ended); on the local backend, any process of the replica still alive (its supervisor gone or not).
    present: bool = False
    # When it ended (EXITED), as the backend saw it: the first failing replica of an attempt is the earliest.
    finished_at: datetime | None = None
    # When its command started running (RUNNING or EXITED), where the backend knows.
    started_at: datetime | None = None
    # LOST, and the backend knows nothing of it is left anywhere (its supervisor died leaving no process, its pod
    # was deleted), as opposed to a node it cannot reach, where it cannot tell.
    gone: bool = False
    # Ended (or being ended) by the cluster through no fault of the job: why, e.g. "preempted by the cluster's
    # scheduler", "evicted: node memory pressure". The attempt is requeued without spending the job's backoff.
    disruption: str = ""


@dataclass(frozen=True)
class LaunchReplica:
    rank: int
    node: str
    gpu_ids: tuple[int, ...]
    env: dict[str, str]


@dataclass(frozen=True)
class LaunchSpec:
    job_id: int
    attempt_id: int
    attempt_number: int
    command: str
    image: str
    replicas: list[LaunchReplica]
    # What a cluster backend needs to build pods (the local backend ignores them).
    job_name: str = ""
    job_type: str = "training"
    user: str = ""
    group: str = ""
    group_volume: str = ""  # Group.volume_path
    image_root: str = ""  # Image.local_root: the local backend's environment for the image (a venv, prefix, rootfs)
    request: dict[str, int] = field(default_factory=dict)  # per replica: gpu, cpu (millicores), memory (bytes)
    node_selector: dict[str, str] = field(default_factory=dict)  # from the instance type
    tolerations: list[dict] = field(default_factory=list)  # from the instance type
    gpu_resource: str = ""  # from the instance type: the extended resource of its GPUs ("": the backend's default)
    capabilities: list[str] = field(default_factory=list)  # from the instance type: Linux capabilities kept
    priority: str = ""  # the job's priority by name (low, normal, high)
    deadline: datetime | None = None  # admitted_at + active_deadline_seconds
