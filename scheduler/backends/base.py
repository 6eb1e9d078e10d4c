"""The interface every backend implements: launch, stop, observe, logs, capacity."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

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
