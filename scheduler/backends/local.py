"""The local backend: each replica is a real process on this machine, supervised by ``local_runner.py``.

Each supervisor is forked by the installation's launcher (launcher.py: one long-lived process that has the
supervisor's modules loaded, started by the first launch, found again after a restart, its socket
``state/launcher-<code digest>.sock``); when there is none and none can be started, or it fails, the supervisor
starts as an interpreter of its own, as it did before, and the log says so. Either way it is the same program.

Layout under JOBSITE_LOCAL_ROOT, one directory per job / attempt / replica:
  work/job-<id>/attempt-<n>/hostfile        the attempt's hostfile (JOB_HOSTFILE), one line per replica
  work/job-<id>/attempt-<n>/replica-<r>/    the working directory (deleted by TTL)
  state/job-<id>/attempt-<n>/replica-<r>/   launched, runner.pid, child.pid, sandbox.pid, stop, reason, exit_code
                                            (read back after a restart)
  state/events.sock                         the leading scheduler's Unix datagram socket: each supervisor sends
                                            one datagram after writing its exit code, so the exit is synced at once
  logs/job-<id>/attempt-<n>/replica-<r>.log stdout and stderr (kept)

A replica's processes are those that carry its marker, the environment variable
``JOBSITE_REPLICA=<root id>:<job>:<attempt>:<rank>`` every process it starts inherits (``setsid`` escapees
included; the root id is this installation's JOBSITE_LOCAL_ROOT, so two installations never touch each other's
processes), and, while its supervisor lives, every descendant of the supervisor (a child subreaper; a supervisor
forked by the launcher is itself found by its ``runner.pid`` only: /proc shows it the launcher's environment).
``stop`` signals them all, whether the supervisor lives or not; ``observe`` reports a replica ``present`` while any of
them lives, so its GPUs are handed on only once nothing of it is left.

Unless JOBSITE_LOCAL_SANDBOX is ``off``, each replica runs in a sandbox (sandbox.py): it sees none of the above
but its working directory and hostfile, runs as an unprivileged user in its own PID namespace (everything in it
dies with its first process or its supervisor), and its output reaches the log through its supervisor.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

from django.conf import settings

from scheduler.values import LaunchSpec, Node, ReplicaObservation, ReplicaState

from . import launcher, limits, netns, sandbox
from .base import BackendDefaults, LaunchError, LogLayout, hostfile_text, replica_launch_env
from .environments import BadEnvironment, Environment, read_environment
from .local_runner import (
    LEFT_FILE,
    MARKER,
    Proc,
    live_process,
    markers,
    notify,
    processes,
    replica_processes,
    send_all,
    unix_address,
    write_atomic,
)

log = logging.getLogger(__name__)

RUNNER = launcher.RUNNER  # the supervisor (a test may name another: it then starts as an interpreter)
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
    """The replica's end from the exit code its supervisor wrote (atomically), timed by the file; None: not yet.
    A limit that ended it (the ``reason`` its supervisor wrote before) is told as Kubernetes tells it: OOMKilled is
    the status of an exit (137); Evicted (its working directory over its bound) a replica that cannot run, until
    its attempt is stopped (the ``stop`` file): then an exit like any other, as an evicted pod once deleted."""
    try:
        code = int(exit_file.read_text().strip() or 1)
        finished = datetime.fromtimestamp(exit_file.stat().st_mtime, tz=UTC)
    except FileNotFoundError:
        return None
    try:
        why = json.loads(exit_file.with_name("reason").read_text())
    except (OSError, ValueError):
        why = {}
    reason, message = str(why.get("reason", "")), str(why.get("message", ""))
    if reason == "Evicted" and not exit_file.with_name("stop").exists():
        return ReplicaObservation(rank, ReplicaState.FAILED, exit_code=code, status=reason, reason=reason,
                                  message=message, finished_at=finished, present=present)
    return ReplicaObservation(rank, ReplicaState.EXITED, exit_code=code, status=reason, reason=reason,
                              message=message, finished_at=finished, present=present)


class _Processes:
    """The process table, read once per call and only when a call needs it."""

    def __init__(self, uids: tuple[int, ...] = ()):
        self._table: dict[int, Proc] | None = None
        self._tags: dict[int, str] = {}
        self._uids = uids

    def of(self, marker: str, runner: tuple[int, str] | None = None) -> list[Proc]:
        if self._table is None:
            self._table = processes(self._uids)
            self._tags = markers(self._table)
        return replica_processes(marker, table=self._table, tags=self._tags, runner=runner)


def _pid_file(path: Path) -> tuple[int, str] | None:
    """(pid, start time) written in ``path``; None when there is none."""
    try:
        pid_text, start = path.read_text().split()
        return int(pid_text), start
    except (OSError, ValueError):
        return None


def _age(path: Path) -> float | None:
    """Seconds since the time written in ``path``; None when there is none."""
    try:
        return time.time() - float(path.read_text().strip())
    except (OSError, ValueError):
        return None


class ExitEvents:
    """The scheduler's end of the supervisors' exit datagrams: a Unix datagram socket bound at ``path``.

    Only the leading scheduler binds it (a new leader takes the name over: the supervisors send to the path). The
    datagrams carry nothing but "look now": what ended is read from the state files, as by any sync, so a lost one
    only delays the sync to the next interval."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            with unix_address(path) as address:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # left by a scheduler that died, or by the leader before this one
                self._sock.bind(address)
            os.chmod(path, 0o600)  # only the server's user (its supervisors) may wake it
            self._inode = os.stat(path).st_ino
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)

    def wait(self, timeout: float) -> bool:
        """Whether a datagram came within ``timeout`` seconds; reads all those waiting (one sync covers them)."""
        select.select([self._sock], [], [], timeout)
        got = False
        while True:
            try:
                self._sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return got
            got = True

    def wake(self) -> None:
        """End a ``wait`` under way in another thread (to close the socket from the thread that waits on it)."""
        notify(self.path, b"wake")

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:  # not a later leader's
                os.unlink(self.path)


class LocalBackend(BackendDefaults):
    name = "local"
    reports_exits = True

    def __init__(self, root: Path | None = None, node: str | None = None, gpus: int | None = None, *,
                 log_layout: LogLayout):
        self.root = Path(root or settings.JOBSITE_LOCAL_ROOT)
        self.log_layout = log_layout
        self.node = node or settings.JOBSITE_LOCAL_NODE
        self._gpus = gpus
        self.bwrap = sandbox.resolve_mode()  # refuses to start when the sandbox is required and missing
        self.unsandboxed_warning = self.bwrap is None and settings.JOBSITE_LOCAL_SANDBOX != "off"
        # A sandboxed attempt's replicas share a network namespace of their own (netns.py).
        self.network = netns.resolve_mode() if self.bwrap else None
        # Each replica's memory, CPU, processes and disk (limits.py): refuses to start when required and missing.
        self.limits = limits.resolve(self.root_id)
        self.limits.prune()
        # As root, sandboxed processes run as the sandbox's user: they are ours to find and stop all the same.
        self.uids = (settings.JOBSITE_LOCAL_SANDBOX_UID,) if os.geteuid() == 0 else ()
        # Supervisors being started: each forks and its first process exits at once; reaped on later calls.
        self._launchers: list[subprocess.Popen] = []
        self._launchers_lock = threading.Lock()
        # The installation's launcher (launcher.py), which forks supervisors: started on the first launch.
        # JOBSITE_LOCAL_LAUNCHER off: an interpreter per replica; ..._IDLE_SECONDS: it exits once idle this long.
        idle = float(settings.JOBSITE_LOCAL_LAUNCHER_IDLE_SECONDS)
        self.launcher = (launcher.Launcher(self.root / "state", idle=idle)
                         if settings.JOBSITE_LOCAL_LAUNCHER else None)

    @property
    def events_path(self) -> Path:
        return self.root / "state" / "events.sock"

    def exit_events(self) -> ExitEvents:
        """Bind the socket the supervisors report exits to (the scheduler loop, while it leads)."""
        return ExitEvents(self.events_path)

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
            self.log_layout(self.root / "logs", job_id, attempt_number, rank),
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

    def launch(self, spec: LaunchSpec, *, retries: int | None = None) -> dict:
        # No API to retry: ``retries`` is not used. One rendezvous per attempt: the same free port and hostfile for
        # every replica.
        master_port = free_port()
        try:
            hostfile = self._write_hostfile(spec)
        except OSError as exc:
            raise LaunchError(f"cannot write the hostfile: {exc}") from exc
        try:
            environment = read_environment(spec.image_root) if spec.image_root else None
        except (OSError, BadEnvironment) as exc:
            raise LaunchError(f"image {spec.image}: {exc}") from exc
        network = self._open_network(spec, hostfile.parent)
        try:
            for replica in spec.replicas:
                try:
                    self._launch_replica(spec, replica, hostfile, master_port, network, environment)
                except (OSError, subprocess.SubprocessError) as exc:
                    self.stop(job_id=spec.job_id, attempt_number=spec.attempt_number, replicas=replica.rank,
                              force=True)
                    raise LaunchError(f"cannot start replica {replica.rank}: {exc}") from exc
        finally:
            if network is not None:  # every supervisor holds the namespace now: it ends with the last of them
                network.close()
        return {"root": str(self.root)}

    def _open_network(self, spec: LaunchSpec, attempt_dir: Path) -> netns.Network | None:
        """The attempt's network namespace (sandboxed replicas only), and its resolver's address for outbound."""
        if self.network is None:
            return None
        facts = netns.host_facts(self.network)
        try:
            if facts.outbound:
                write_atomic(attempt_dir / "resolv.conf", netns.RESOLV_CONF)
            network = netns.open_network(facts, f"{self.root_id}:{spec.job_id}:{spec.attempt_number}",
                                         self.launcher)
        except OSError as exc:
            raise LaunchError(f"cannot make the job's network: {exc}") from exc
        with self._launchers_lock:  # reaped like the launchers once they end
            self._launchers += network.processes
        return network

    def _launch_replica(self, spec: LaunchSpec, replica, hostfile: Path, master_port: int,
                        network: netns.Network | None, environment: Environment | None) -> None:
        work, state, log_file = self._dirs(spec.job_id, spec.attempt_number, replica.rank)
        for d in (work, log_file.parent):
            d.mkdir(parents=True, exist_ok=True)
        try:
            state.mkdir(parents=True)
        except FileExistsError:  # a relaunch in place: the last run's files go
            # Not the ``stop`` file: a stop that came first keeps the command from ever starting.
            for stale in ("runner.pid", "child.pid", "sandbox.pid", LEFT_FILE, "exit_code"):
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
        command, options, keep = ["/bin/bash", "-c", spec.command], [], ()
        if self.bwrap:
            resolv = hostfile.parent / "resolv.conf"
            facts = sandbox.host_facts(bwrap=self.bwrap, work_dir=work, command=command, hostfile=hostfile,
                                       group_volume=spec.group_volume, gpu_ids=replica.gpu_ids,
                                       memory_bytes=int(spec.request.get("memory", 0)),
                                       resolv_conf=str(resolv) if network and network.facts.outbound else "",
                                       environment=environment)
            if facts.privileged:  # the sandbox's user writes here, and only here
                os.chown(work, facts.uid, facts.gid)
            command, env = sandbox.sandbox_argv(facts), sandbox.sandbox_env(env, facts)
            options = ["--sandboxed", f"{facts.uid}:{facts.gid}"]
            if network is not None:
                options, keep = [*options, *network.runner_options()], (network.keep_fd,)
        else:
            if environment is not None:  # unsandboxed: its bin first, that is all (a root file system is no use)
                env.update(environment.variables, PATH=":".join(filter(None, [environment.bin, env["PATH"]])))
            if self.unsandboxed_warning:
                with open(log_file, "a") as f:
                    f.write(f"jobsite: WARNING: {sandbox.MISSING_WARNING}\n")
        argv = [sys.executable, str(RUNNER), "--grace", str(settings.JOBSITE_TERMINATION_GRACE_SECONDS),
                *options, *self.limits.runner_options(spec, replica.rank), "--notify", str(self.events_path),
                str(state), str(log_file), str(work), "--", *command]
        self._start_supervisor(argv, env, keep)

    def _start_supervisor(self, argv: list[str], env: dict[str, str], keep: tuple[int, ...] = ()) -> None:
        """Start a supervisor without waiting for it: forked by the launcher, or, when there is none (or another
        supervisor than ``local_runner.py`` is asked for), as an interpreter of its own, whose start-up is most of
        a launch. It detaches by itself; one that never writes its pid is found by ``observe`` after
        JOBSITE_LOCAL_START_TIMEOUT_SECONDS (the ``launched`` file is written before)."""
        if self.launcher is not None and argv[1] == str(launcher.RUNNER):
            try:
                self.launcher.launch(argv, env, keep)
                return
            except launcher.Unavailable as exc:  # the first launch of a scheduler that found none: info only
                log.log(logging.WARNING if self.launcher.seen or self.launcher.failure else logging.INFO,
                        "launcher of %s unavailable (%s): the supervisor starts as an interpreter of its own",
                        self.root, exc)
            except launcher.NoAnswer as exc:  # it may have started: a second one would run the replica twice
                log.warning("launcher of %s gave no answer (%s): the supervisor is not started again; if it did "
                            "not start, the replica is lost after %s s", self.root, exc,
                            settings.JOBSITE_LOCAL_START_TIMEOUT_SECONDS)
                return
        with self._launchers_lock:
            self._launchers = [p for p in self._launchers if p.poll() is None]
            # Its own session from its first instruction: a kill of the scheduler's process group never takes it.
            self._launchers.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, pass_fds=keep,
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                    start_new_session=True))

    def _runner(self, state: Path) -> tuple[int, str] | None:
        """The supervisor (pid, start time) if it is still alive (same process, not a reused pid, not a zombie)."""
        if (written := _pid_file(state / "runner.pid")) is None:
            return None
        proc = live_process(written[0])
        return written if proc is not None and proc.start == written[1] else None

    def stuck_after(self) -> float:
        # This backend is its own kubelet: SIGKILL once the grace period after SIGTERM is over.
        return float(settings.JOBSITE_TERMINATION_GRACE_SECONDS)

    def stop(self, *, job_id: int, attempt_number: int, replicas: int, force: bool = False) -> None:
        """SIGTERM (force: SIGKILL) to every process of every replica, the supervisor's or not, its supervisor
        excepted: it outlives them to kill what they leave and record the exit, and so is the sandbox's own
        process (it ends with the command, and the whole sandbox with it). Each replica's ``stop`` file is written
        first, so a supervisor that has not started the command yet never does."""
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
            found = _Processes(self.uids)
            targets = []
            for rank in range(replicas):
                state = self._dirs(job_id, attempt_number, rank)[1]
                runner = self._runner(state)
                spared = {runner, _pid_file(state / "sandbox.pid") if runner else None}
                targets += [p for p in found.of(self.marker(job_id, attempt_number, rank), runner)
                            if (p.pid, p.start) not in spared and (p.pid, p.start) not in signalled]
            if not targets:
                return
            send_all(targets, sig)
            signalled.update((p.pid, p.start) for p in targets)

    def observe(self, *, job_id: int, attempt_number: int, replicas: int) -> list[ReplicaObservation]:
        if self._launchers:
            with self._launchers_lock:  # no zombie launchers left when launches stop
                self._launchers = [p for p in self._launchers if p.poll() is None]
        found = _Processes(self.uids)
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
        # Ended by its supervisor, which killed all it left before writing the exit code: nothing to look for.
        if not (state / LEFT_FILE).exists() and (ended := _exited(rank, exit_file, present=False)) is not None:
            return ended
        left = processes_of()  # no supervisor: what is left of the replica, read once
        if (ended := _exited(rank, exit_file, present=bool(left))) is not None:
            return ended
        who = f"the supervisor of replica {rank} on {self.node}"
        still = f"; {len(left)} of its processes still running" if left else ""
        if (state / "runner.pid").exists():
            if self._runner(state) is not None:
                # It wrote its pid between the two looks: it has just started, not gone.
                return ReplicaObservation(rank, ReplicaState.STARTING, present=True)
            return ReplicaObservation(rank, ReplicaState.LOST, message=f"{who} is gone{still}", present=bool(left),
                                      gone=not left)
        if (state / "stop").exists() and not left:
            # Stopped before its supervisor started, and none runs: should it start now, it sees the stop file and
            # runs nothing.
            return ReplicaObservation(rank, ReplicaState.LOST, message=f"{who} was stopped before it started",
                                      gone=True)
        waited = _age(state / "launched")
        if waited is None and not left:
            # Never launched here (the ``launched`` file comes first): the launch claimed for it died with its
            # scheduler. Its caller asks only when no launch of the attempt is under way in its own process.
            return ReplicaObservation(rank, ReplicaState.LOST, gone=True,
                                      message=f"replica {rank} was never launched on {self.node}: nothing of it "
                                              "started (its launcher was interrupted)")
        bound = settings.JOBSITE_LOCAL_START_TIMEOUT_SECONDS
        if waited is not None and waited > bound:
            return ReplicaObservation(rank, ReplicaState.LOST, present=bool(left), gone=not left,
                                      message=f"{who} never started (no pid {bound} s after the launch){still}")
        return ReplicaObservation(rank, ReplicaState.STARTING, present=bool(left))

    def cleanup(self, *, job_id: int, attempt_number: int, replicas: int) -> None:
        """Delete the working and state directories of an attempt (TTL), and its replicas' cgroups. Logs stay."""
        self.limits.remove(job_id=job_id, attempt_number=attempt_number, replicas=replicas)
        for kind in ("work", "state"):
            job_dir = self.root / kind / f"job-{job_id}"
            shutil.rmtree(job_dir / f"attempt-{attempt_number}", ignore_errors=True)
            try:
                job_dir.rmdir()  # once its last attempt is gone
            except OSError:
                pass
