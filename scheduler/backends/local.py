"""The local backend: each replica is a real process on this machine, supervised by ``local_runner.py``.

Layout under JOBSITE_LOCAL_ROOT, one directory per job / attempt / replica:
  work/job-<id>/attempt-<n>/hostfile        the attempt's hostfile (JOB_HOSTFILE), one line per replica
  work/job-<id>/attempt-<n>/replica-<r>/    the working directory (deleted by TTL)
  state/job-<id>/attempt-<n>/replica-<r>/   runner.pid, child.pid, exit_code (read back after a restart)
  logs/job-<id>/attempt-<n>/replica-<r>.log stdout and stderr (kept)
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

from django.conf import settings

from jobs.logs import replica_log_path
from scheduler.core import Node

from .base import LaunchError, LaunchSpec, ReplicaObservation, ReplicaState, hostfile_text, replica_launch_env
from .local_runner import proc_start_time, write_atomic

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


def _exited(rank: int, exit_file: Path) -> ReplicaObservation | None:
    """The replica's end from the exit code its supervisor wrote (atomically), timed by the file; None: not yet."""
    try:
        code = int(exit_file.read_text().strip() or 1)
        finished = datetime.fromtimestamp(exit_file.stat().st_mtime, tz=UTC)
    except FileNotFoundError:
        return None
    return ReplicaObservation(rank, ReplicaState.EXITED, exit_code=code, finished_at=finished)


class LocalBackend:
    name = "local"

    def __init__(self, root: Path | None = None, node: str | None = None, gpus: int | None = None):
        self.root = Path(root or settings.JOBSITE_LOCAL_ROOT)
        self.node = node or settings.JOBSITE_LOCAL_NODE
        self._gpus = gpus

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
                for stale in ("runner.pid", "child.pid", "exit_code"):
                    (state / stale).unlink(missing_ok=True)
                env = {
                    "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
                    "HOME": str(work),
                    "LANG": os.environ.get("LANG", "C.UTF-8"),
                    "PYTHONUNBUFFERED": "1",
                    **replica_launch_env(spec, replica, master_addr=LOCAL_ADDR, master_port=master_port,
                                         hostfile=str(hostfile)),
                }
                argv = [sys.executable, str(RUNNER), str(state), str(log_file), str(work), "--",
                        "/bin/bash", "-c", spec.command]
                subprocess.run(argv, env=env, check=True, timeout=30, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            except (OSError, subprocess.SubprocessError) as exc:
                self.stop(job_id=spec.job_id, attempt_number=spec.attempt_number, replicas=len(started), force=True)
                raise LaunchError(f"cannot start replica {replica.rank}: {exc}") from exc
            started.append(replica.rank)
        return {"root": str(self.root)}

    def _runner(self, state: Path) -> int | None:
        """The supervisor's pid if it is still alive (same process, not a reused pid)."""
        try:
            pid_text, start = (state / "runner.pid").read_text().split()
            pid = int(pid_text)
            return pid if proc_start_time(pid) == start else None
        except (OSError, ValueError):
            return None

    def stuck_after(self) -> float:
        # This backend is its own kubelet: SIGKILL once the grace period after SIGTERM is over.
        return float(settings.JOBSITE_TERMINATION_GRACE_SECONDS)

    def stop(self, *, job_id: int, attempt_number: int, replicas: int, force: bool = False) -> None:
        sig = signal.SIGKILL if force else signal.SIGTERM
        for rank in range(replicas):
            _, state, _ = self._dirs(job_id, attempt_number, rank)
            pid = self._runner(state)
            if pid is None:
                continue
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
            except PermissionError:
                log.warning("no permission to signal process group %s", pid)

    def observe(self, *, job_id: int, attempt_number: int, replicas: int) -> list[ReplicaObservation]:
        result = []
        for rank in range(replicas):
            _, state, _ = self._dirs(job_id, attempt_number, rank)
            exit_file = state / "exit_code"
            if (ended := _exited(rank, exit_file)) is not None:
                result.append(ended)
            elif self._runner(state) is not None:
                running = (state / "child.pid").exists()
                result.append(ReplicaObservation(rank, ReplicaState.RUNNING if running else ReplicaState.STARTING))
            elif (ended := _exited(rank, exit_file)) is not None:  # it ended between the two checks
                result.append(ended)
            elif not (state / "runner.pid").exists():
                result.append(ReplicaObservation(rank, ReplicaState.STARTING))
            else:
                result.append(ReplicaObservation(rank, ReplicaState.LOST,
                                                 message=f"the supervisor of replica {rank} on {self.node} is gone"))
        return result

    def cleanup(self, *, job_id: int, attempt_number: int, replicas: int) -> None:
        """Delete the working and state directories of an attempt (TTL). Logs stay."""
        for kind in ("work", "state"):
            job_dir = self.root / kind / f"job-{job_id}"
            shutil.rmtree(job_dir / f"attempt-{attempt_number}", ignore_errors=True)
            try:
                job_dir.rmdir()  # once its last attempt is gone
            except OSError:
                pass
