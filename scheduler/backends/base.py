"""The interface every backend implements: launch, stop, observe, logs, capacity."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from scheduler.core import Node


class ReplicaState(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"
    LOST = "lost"  # its supervisor stopped reporting and left no exit code


@dataclass(frozen=True)
class ReplicaObservation:
    rank: int
    state: ReplicaState
    exit_code: int | None = None
    status: str = ""
    message: str = ""


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


class LaunchError(Exception):
    """The backend could not start the attempt (bad image, no working directory, ...)."""


class Backend(Protocol):
    name: str

    def nodes(self) -> list[Node]:
        """Nodes and their allocatable resources (free is filled in by the scheduler)."""

    def launch(self, spec: LaunchSpec) -> dict:
        """Start every replica; return backend data to keep on the attempt."""

    def stop(self, *, job_id: int, attempt_number: int, replicas: int, force: bool = False) -> None:
        """Ask every replica to stop (SIGTERM / delete); force kills (SIGKILL / grace 0)."""

    def observe(self, *, job_id: int, attempt_number: int, replicas: int) -> list[ReplicaObservation]:
        """The state of each replica of an attempt, read from the backend (survives restarts)."""

    def log_path(self, *, job_id: int, attempt_number: int, rank: int) -> Path:
        """Where the log of a replica is kept."""
