"""The interface every backend implements (launch, stop, observe, logs, capacity), with the defaults of
its optional parts, and what a backend hands back besides observations (its events, its exit listener)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from scheduler.values import LaunchReplica, LaunchSpec, Node, ReplicaObservation


def processes_per_replica(gpus: int) -> int:
    """How many worker processes a replica holds room for: one per GPU, at least one."""
    return max(int(gpus), 1)


def distributed_env(*, rank: int, replicas: int, gpus: int, master_addr: str, master_port: int,
                    hostfile: str) -> dict[str, str]:
    """The variables distributed launchers read, for replica ``rank`` of ``replicas``, each with ``gpus`` GPUs.

    Pure, and the one place they are computed; a backend supplies only what is its own: the address and port of
    rank 0 and where the replica finds its hostfile. A replica is one process (LOCAL_RANK 0) on its own node
    (NODE_RANK = RANK), which is what torch.distributed's ``env://`` init expects when the command is the
    training script itself. For ``torchrun --nnodes=$WORLD_SIZE --node_rank=$NODE_RANK script.py`` the same
    values are repeated as the ``PET_*`` variables torchrun reads for each flag left out (``--nnodes``,
    ``--node-rank``, ``--nproc-per-node``: one worker per GPU, at least one; ``--master-addr``,
    ``--master-port``), so that no other flag is needed.
    """
    nproc, port = str(processes_per_replica(gpus)), str(master_port)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(replicas),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "NODE_RANK": str(rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": port,
        "PET_NNODES": str(replicas),
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": nproc,
        "PET_MASTER_ADDR": master_addr,
        "PET_MASTER_PORT": port,
        "JOB_HOSTFILE": hostfile,
    }


def hostfile_text(hosts: Sequence[str], *, gpus: int) -> str:
    """An MPI-style hostfile: one line per replica, in rank order, with its address and its slots (GPUs, >= 1)."""
    slots = processes_per_replica(gpus)
    return "".join(f"{host} slots={slots}\n" for host in hosts)


def replica_launch_env(spec: LaunchSpec, replica: LaunchReplica, *, master_addr: str, master_port: int,
                       hostfile: str) -> dict[str, str]:
    """What a backend starts a replica with: its own environment, then the distributed variables over it.

    The scheduler's variables win over a job's own ``env`` of the same name, as the identity variables do.
    """
    return {
        **replica.env,
        **distributed_env(rank=replica.rank, replicas=len(spec.replicas), gpus=int(spec.request.get("gpu", 0)),
                          master_addr=master_addr, master_port=master_port, hostfile=hostfile),
    }


class LaunchError(Exception):
    """The backend could not start the attempt (bad image, no working directory, ...)."""


class BackendUnavailable(Exception):
    """The backend's API kept failing through every retry: a launch it cut short may be tried again."""


# Where a replica's log file is kept under a root: (root, job id, attempt number, rank) -> path. The scheduler hands
# it in (the layout is the one the web reads logs from).
LogLayout = Callable[[Path, int, int, int], Path]
# The attempts whose objects are kept, as (job id, attempt number); read by the caller when the backend asks.
LiveAttempts = Callable[[], set[tuple[int, int]]]


@dataclass(frozen=True)
class BackendEvent:
    """Something the backend saw happen to a replica (a Kubernetes Event), not yet recorded as a job event.

    ``key`` identifies it and its count (a repeated event comes again with a larger ``count``); ``at`` orders it.
    """

    key: tuple[str, int]
    rank: int
    count: int
    reason: str
    message: str
    type: str  # "Warning" or "Normal"
    at: str


class ExitListener(Protocol):
    """A bound socket replicas report their exits to (``Backend.exit_events``)."""

    def wait(self, timeout: float) -> bool:
        """Whether an exit was reported within ``timeout`` seconds."""

    def wake(self) -> None:
        """End a ``wait`` under way at once."""

    def close(self) -> None:
        """Stop listening."""


class Backend(Protocol):
    name: str
    reports_exits: ClassVar[bool]  # whether ``exit_events`` gives a listener

    def start(self) -> None:
        """Begin watching (the leader, on taking the lead): a fresh list of what exists."""

    def close(self) -> None:
        """Stop watching and copying (a standby, on losing the lead)."""

    def nodes(self) -> list[Node] | None:
        """Nodes and their allocatable resources (free is filled in by the scheduler); None while the backend has
        not read them yet (the nodes last recorded stand)."""

    def launch(self, spec: LaunchSpec, *, retries: int | None = None) -> dict:
        """Start every replica; return backend data to keep on the attempt. ``retries``: of a failing API call
        (None: the backend's own); ``BackendUnavailable`` when they ran out, and the launch may be tried again."""

    def stop(self, *, job_id: int, attempt_number: int, replicas: int, force: bool = False) -> None:
        """Ask every replica to stop with the job's grace period (SIGTERM / delete); force kills (SIGKILL / grace 0)."""

    def stuck_after(self) -> float:
        """Seconds after a graceful stop past which replicas still there are force-stopped."""

    def observe(self, *, job_id: int, attempt_number: int, replicas: int) -> list[ReplicaObservation]:
        """The state of each replica of an attempt, read from the backend (survives restarts)."""

    def events(self, *, job_id: int, attempt_number: int, replicas: int) -> list[BackendEvent]:
        """What happened to the attempt's replicas that was not handed out as recorded yet (``events_recorded``)."""

    def events_recorded(self, keys: set[tuple[str, int]]) -> None:
        """The events of these keys are recorded: not handed out again."""

    def log_path(self, *, job_id: int, attempt_number: int, rank: int) -> Path:
        """Where the log of a replica is kept (for Kubernetes: the archive, kept current while it runs)."""

    def cleanup(self, *, job_id: int, attempt_number: int, replicas: int) -> None:
        """Delete what an ended attempt leaves behind (working dirs, pods) after its TTL; keep its logs."""

    def delete_orphans(self, *, live: LiveAttempts) -> list[str]:
        """Delete what belongs to no live attempt (``live`` is asked after the backend has listed what exists);
        the names of what was deleted."""

    def exit_events(self) -> ExitListener | None:
        """Bind the socket replicas report their exits to (None: this backend has none)."""


class BackendDefaults:
    """What a backend without watches, orphans, events or an exit socket does: nothing (backends inherit it)."""

    reports_exits: ClassVar[bool] = False

    def start(self) -> None:
        return None

    def close(self) -> None:
        return None

    def events(self, *, job_id: int, attempt_number: int, replicas: int) -> list[BackendEvent]:
        return []

    def events_recorded(self, keys: set[tuple[str, int]]) -> None:
        return None

    def delete_orphans(self, *, live: LiveAttempts) -> list[str]:
        return []

    def exit_events(self) -> ExitListener | None:
        return None
