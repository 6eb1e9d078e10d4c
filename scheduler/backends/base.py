"""The interface every backend implements: launch, stop, observe, logs, capacity."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

from scheduler.core import Node


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
    # Its object still exists on the cluster and holds its node's resources until it is deleted (a pod, even one
    # whose container ended). A local process that exited holds nothing: False.
    present: bool = False
    # When it ended (EXITED), as the backend saw it: the first failing replica of an attempt is the earliest.
    finished_at: datetime | None = None


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
    request: dict[str, int] = field(default_factory=dict)  # per replica: gpu, cpu (millicores), memory (bytes)
    node_selector: dict[str, str] = field(default_factory=dict)  # from the instance type
    tolerations: list[dict] = field(default_factory=list)  # from the instance type
    deadline: datetime | None = None  # admitted_at + active_deadline_seconds


class LaunchError(Exception):
    """The backend could not start the attempt (bad image, no working directory, ...)."""


class Backend(Protocol):
    name: str

    def nodes(self) -> list[Node]:
        """Nodes and their allocatable resources (free is filled in by the scheduler)."""

    def launch(self, spec: LaunchSpec) -> dict:
        """Start every replica; return backend data to keep on the attempt."""

    def stop(self, *, job_id: int, attempt_number: int, replicas: int, force: bool = False) -> None:
        """Ask every replica to stop with the job's grace period (SIGTERM / delete); force kills (SIGKILL / grace 0)."""

    def stuck_after(self) -> float:
        """Seconds after a graceful stop past which replicas still there are force-stopped."""

    def observe(self, *, job_id: int, attempt_number: int, replicas: int) -> list[ReplicaObservation]:
        """The state of each replica of an attempt, read from the backend (survives restarts)."""

    def log_path(self, *, job_id: int, attempt_number: int, rank: int) -> Path:
        """Where the log of a replica is kept (for Kubernetes: the archive, kept current while it runs)."""

    def cleanup(self, *, job_id: int, attempt_number: int, replicas: int) -> None:
        """Delete what an ended attempt leaves behind (working dirs, pods) after its TTL; keep its logs."""
