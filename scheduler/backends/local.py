"""The local backend: each replica is a real process on this machine, supervised by ``local_runner.py``.

Layout under JOBSITE_LOCAL_ROOT, one directory per job / attempt / replica:
  work/job-<id>/attempt-<n>/hostfile        the attempt's hostfile (JOB_HOSTFILE), one line per replica
  work/job-<id>/attempt-<n>/replica-<r>/    the working directory (deleted by TTL)
  state/job-<id>/attempt-<n>/replica-<r>/   launched, runner.pid, child.pid, stop, exit_code (read back after a
                                            restart)
  logs/job-<id>/attempt-<n>/replica-<r>.log stdout and stderr (kept)

A replica's processes are those that carry its marker, the environment variable
``JOBSITE_REPLICA=<root id>:<job>:<attempt>:<rank>`` every process it starts inherits (``setsid`` escapees
included; the root id is this installation's JOBSITE_LOCAL_ROOT, so two installations never touch each other's
processes), and, while its supervisor lives, every descendant of the supervisor (a child subreaper). ``stop``
signals them all, whether the supervisor lives or not; ``observe`` reports a replica ``present`` while any of
them lives, so its GPUs are handed on only once nothing of it is left.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

from django.conf import settings

from jobs.logs import replica_log_path
from scheduler.core import Node

from .base import LaunchError, LaunchSpec, ReplicaObservation, ReplicaState, hostfile_text, replica_launch_env
from .local_runner import (
    MARKER,
    Proc,
    live_process,
    markers,
    processes,
    replica_processes,
    send_all,
    write_atomic,
)

log = logging.getLogger(__name__)

RUNNER = Path(__file__).with_name("local_runner.py")
# Every replica runs on this machine: rank 0 listens on the loopback interface.
LOCAL_ADDR = "127.0.0.1"


def free_port() -> int:
    """A TCP port nothing listens on now, chosen by the kernel (bind port 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def detect_gpus() -> int | None:
    """Number of GPUs nvidia-smi lists, or None when there is no nvidia-smi or no GPU."""
    if not settings.JOBSITE_LOCAL_USE_NVIDIA_SMI or not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    return count or None


def _exited(rank: int, exit_file: Path, present: bool) -> ReplicaObservation | None:
    """The replica's end from the exit code its supervisor wrote (atomically), timed by the file; None: not yet."""
    try:
        code = int(exit_file.read_text().strip() or 1)
        finished = datetime.fromtimestamp(exit_file.stat().st_mtime, tz=UTC)
    except FileNotFoundError:
        return None
    return ReplicaObservation(rank, ReplicaState.EXITED, exit_code=code, finished_at=finished, present=present)


class _Processes:
    """The process table, read once per call and only when a call needs it."""

    def __init__(self):
        self._table: dict[int, Proc] | None = None
        self._tags: dict[int, str] = {}

    def of(self, marker: str, runner: tuple[int, str] | None = None) -> list[Proc]:
        if self._table is None:
            self._table = processes()
            self._tags = markers(self._table)
        return replica_processes(marker, table=self._table, tags=self._tags, runner=runner)


def _age(path: Path) -> float | None:
    """Seconds since the time written in ``path``; None when there is none."""
    try:
        return time.time() - float(path.read_text().strip())
    except (OSError, ValueError):
        return None


class LocalBackend:
    name = "local"

    def __init__(self, root: Path | None = None, node: str | None = None, gpus: int | None = None):
        self.root = Path(root or settings.JOBSITE_LOCAL_ROOT)
        self.node = node or settings.JOBSITE_LOCAL_NODE
        self._gpus = gpus

    @cached_property
    def root_id(self) -> str:
        """This installation, in the marker of its processes: a digest of its root directory."""
        return hashlib.sha256(os.fsencode(self.root.resolve())).hexdigest()[:16]

    def marker(self, job_id: int, attempt_number: int, rank: int) -> str:
        return f"{self.root_id}:{job_id}:{attempt_number}:{rank}"

    @cached_property
    def gpus(self) -> int:
        if self._gpus is not None:
            return self._gpus
        return detect_gpus() or settings.JOBSITE_LOCAL_GPUS

    def nodes(self) -> list[Node]:
        # Only GPUs are accounted locally: CPU and memory of the one machine are shared by its processes.
        return [Node(name=self.node, allocatable={"gpu": self.gpus}, free={"gpu": self.gpus})]

    def _dirs(self, job_id: int, attempt_number: int, rank: int) -> tuple[Path, Path, Path]:
        rel = Path(f"job-{job_id}") / f"attempt-{attempt_number}"
        return (
            self.root / "work" / rel / f"replica-{rank}",
            self.root / "state" / rel / f"replica-{rank}",
            replica_log_path(self.root / "logs", job_id, attempt_number, rank),
        )

    def log_path(self, *, job_id: int, attempt_number: int, rank: int) -> Path:
        return self._dirs(job_id, attempt_number, rank)[2]

    def hostfile_path(self, *, job_id: int, attempt_number: int) -> Path:
        return self.root / "work" / f"job-{job_id}" / f"attempt-{attempt_number}" / "hostfile"

    def _write_hostfile(self, spec: LaunchSpec) -> Path:
        """The attempt's hostfile, written once before its replicas start (atomically: none sees half of it)."""
        path = self.hostfile_path(job_id=spec.job_id, attempt_number=spec.attempt_number)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, hostfile_text([LOCAL_ADDR] * len(spec.replicas), gpus=int(spec.request.get("gpu", 0))))
        return path

    def launch(self, spec: LaunchSpec) -> dict:
        # One rendezvous per attempt: the same free port and hostfile for every replica.
        master_port = free_port()
        try:
            hostfile = self._write_hostfile(spec)
        except OSError as exc:
            raise LaunchError(f"cannot write the hostfile: {exc}") from exc
        started = []
        for replica in spec.replicas:
            work, state, log_file = self._dirs(spec.job_id, spec.attempt_number, replica.rank)
            try:
                for d in (work, state, log_file.parent):
                    d.mkdir(parents=True, exist_ok=True)
                # Not the ``stop`` file: a stop that came first keeps the command from ever starting.
                for stale in ("runner.pid", "child.pid", "exit_code"):
                    (state / stale).unlink(missing_ok=True)
                write_atomic(state / "launched", f"{time.time():.3f}")
                env = {
                    "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
                    "HOME": str(work),
                    "LANG": os.environ.get("LANG", "C.UTF-8"),
                    "PYTHONUNBUFFERED": "1",
                    **replica_launch_env(spec, replica, master_addr=LOCAL_ADDR, master_port=master_port,
                                         hostfile=str(hostfile)),
                    MARKER: self.marker(spec.job_id, spec.attempt_number, replica.rank),
                }
                argv = [sys.executable, str(RUNNER), "--grace", str(settings.JOBSITE_TERMINATION_GRACE_SECONDS),
                        str(state), str(log_file), str(work), "--", "/bin/bash", "-c", spec.command]
                subprocess.run(argv, env=env, check=True, timeout=30, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            except (OSError, subprocess.SubprocessError) as exc:
                self.stop(job_id=spec.job_id, attempt_number=spec.attempt_number, replicas=len(started), force=True)
                raise LaunchError(f"cannot start replica {replica.rank}: {exc}") from exc
            started.append(replica.rank)
        return {"root": str(self.root)}

    def _runner(self, state: Path) -> tuple[int, str] | None:
        """The supervisor (pid, start time) if it is still alive (same process, not a reused pid, not a zombie)."""
        try:
            pid_text, start = (state / "runner.pid").read_text().split()
            proc = live_process(int(pid_text))
        except (OSError, ValueError):
            return None
        return (proc.pid, start) if proc is not None and proc.start == start else None

    def stuck_after(self) -> float:
        # This backend is its own kubelet: SIGKILL once the grace period after SIGTERM is over.
        return float(settings.JOBSITE_TERMINATION_GRACE_SECONDS)

    def stop(self, *, job_id: int, attempt_number: int, replicas: int, force: bool = False) -> None:
        """SIGTERM (force: SIGKILL) to every process of every replica, the supervisor's or not, its supervisor
        excepted: it outlives them to kill what they leave and record the exit. Each replica's ``stop`` file is
        written first, so a supervisor that has not started the command yet never does."""
        sig = signal.SIGKILL if force else signal.SIGTERM
        for rank in range(replicas):
            state = self._dirs(job_id, attempt_number, rank)[1]
            try:
                state.mkdir(parents=True, exist_ok=True)
                write_atomic(state / "stop", str(int(sig)))
            except OSError as exc:
                log.warning("cannot mark replica %s of job %s as stopped: %s", rank, job_id, exc)
        # A forced stop goes on while it finds processes it has not killed yet (started meanwhile), a few rounds.
        signalled: set[tuple[int, str]] = set()
        for _ in range(5 if force else 1):
            found = _Processes()
            targets = []
            for rank in range(replicas):
                runner = self._runner(self._dirs(job_id, attempt_number, rank)[1])
                targets += [p for p in found.of(self.marker(job_id, attempt_number, rank), runner)
                            if (p.pid, p.start) != runner and (p.pid, p.start) not in signalled]
            if not targets:
                return
            send_all(targets, sig)
            signalled.update((p.pid, p.start) for p in targets)

    def observe(self, *, job_id: int, attempt_number: int, replicas: int) -> list[ReplicaObservation]:
        found = _Processes()
        return [self._observe(rank, self._dirs(job_id, attempt_number, rank)[1],
                              lambda rank=rank: found.of(self.marker(job_id, attempt_number, rank)))
                for rank in range(replicas)]

    def _observe(self, rank: int, state: Path, processes_of: Callable[[], list[Proc]]) -> ReplicaObservation:
        """One replica, from its state dir and, when its supervisor is not alive, the processes it left."""
        exit_file = state / "exit_code"
        if self._runner(state) is not None:
            if (ended := _exited(rank, exit_file, present=True)) is not None:  # its supervisor is finishing
                return ended
            running = (state / "child.pid").exists()
            return ReplicaObservation(rank, ReplicaState.RUNNING if running else ReplicaState.STARTING,
                                      present=True)
        left = processes_of()  # no supervisor: what is left of the replica, read once
        if (ended := _exited(rank, exit_file, present=bool(left))) is not None:
            return ended
        who = f"the supervisor of replica {rank} on {self.node}"
        still = f"; {len(left)} of its processes still running" if left else ""
        if (state / "runner.pid").exists():
            return ReplicaObservation(rank, ReplicaState.LOST, message=f"{who} is gone{still}", present=bool(left))
        if (state / "stop").exists() and not left:
            # Stopped before its supervisor started, and none runs: should it start now, it sees the stop file and
            # runs nothing.
            return ReplicaObservation(rank, ReplicaState.LOST, message=f"{who} was stopped before it started")
        waited = _age(state / "launched")
        bound = settings.JOBSITE_LOCAL_START_TIMEOUT_SECONDS
        if waited is not None and waited > bound:
            return ReplicaObservation(rank, ReplicaState.LOST, present=bool(left),
                                      message=f"{who} never started (no pid {bound} s after the launch){still}")
        return ReplicaObservation(rank, ReplicaState.STARTING, present=bool(left))

    def cleanup(self, *, job_id: int, attempt_number: int, replicas: int) -> None:
        """Delete the working and state directories of an attempt (TTL). Logs stay."""
        for kind in ("work", "state"):
            job_dir = self.root / kind / f"job-{job_id}"
            shutil.rmtree(job_dir / f"attempt-{attempt_number}", ignore_errors=True)
            try:
                job_dir.rmdir()  # once its last attempt is gone
            except OSError:
                pass
