"""Supervisor of one replica of the local backend. Standalone: no Django, run as a script.

    python local_runner.py [--grace SECONDS] [--sandboxed UID[:GID]] [--notify SOCKET] [--limits PLAN] \
        [--network HOLDER[:user]] STATE_DIR LOG_FILE WORK_DIR -- ARGV...

Usually forked, with its arguments and environment, by the installation's launcher (launcher.py), which calls
``main`` (and collects the supervisor, its child, when it ends). It detaches (new session; as a script, a fork
too) so the replica outlives the web server that started it, becomes the child subreaper of everything the
command starts (orphans are re-parented to it, not to init), then writes into STATE_DIR: ``runner.pid`` ("pid
starttime"), ``child.pid``, and at the end ``exit_code`` (atomically). With ``--notify SOCKET`` it then sends one
datagram to that Unix socket (the scheduler's, see ``ExitEvents`` in local.py), so the exit is noticed at once
rather than at the next periodic sync; a lost datagram only delays that to the sync.

Every process of the replica carries its marker, the environment variable ``JOBSITE_REPLICA`` the backend sets
("<root id>:<job>:<attempt>:<rank>"), inherited by all it starts, ``setsid`` escapees included. When the command
exits, whatever it left behind (background children, daemons) is killed before ``exit_code`` is written: SIGTERM,
then SIGKILL after the grace period. So a replica that has ended holds nothing: what the kill could not end (a process
stuck in the kernel) is named in ``left`` (its pids), written before ``exit_code``.

A stop that comes before the command has started leaves a ``stop`` file in STATE_DIR (the signal number). The
runner looks for it after writing ``runner.pid`` and again once the command has started (in a sandbox: once the
command runs inside it, the sandbox's own processes being spared by a stop): either the stop sees the
runner's pid and the command, or the runner sees the file, and then records an exit without running the command.

With ``--sandboxed UID[:GID]`` ARGV is a sandbox (bubblewrap, see sandbox.py) around the command, whose processes
may run as UID: the runner writes the sandbox's own process to ``sandbox.pid`` (a stop leaves it alone: it ends with
the command, and everything in the sandbox with it), and copies the command's output into LOG_FILE from a pipe, so
the command never holds the log file itself. While the sandbox runs, the runner is its door: ``exec.sock`` in
STATE_DIR starts commands inside it for the site (local_exec.py). With ``--network`` the command enters the
network namespace (and user namespace, ``:user``) of the attempt's holder process between its fork and its exec.

With ``--limits PLAN`` (a ``cgroups.Plan`` as JSON) the command runs in a cgroup of its own, made before it starts
and entered between its fork and its exec (so the sandbox and all it starts are in it), with RLIMIT_FSIZE at the
working directory's bound, which a thread of the supervisor checks every few seconds (``cgroups.DiskWatch``).
When the replica was ended by the kernel's OOM killer, or for using more disk than its bound, the runner writes
``reason`` (JSON: reason and message, as Kubernetes says them: ``OOMKilled``, ``Evicted``) before ``exit_code``;
then it kills whatever is left in the cgroup and removes it.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

try:
    from . import cgroups, local_exec, netns_sys
except ImportError:  # run as a script (python local_runner.py): its directory is on sys.path
    import cgroups  # type: ignore[no-redef]
    import local_exec  # type: ignore[no-redef]
    import netns_sys  # type: ignore[no-redef]

MARKER = "JOBSITE_REPLICA"
PR_SET_CHILD_SUBREAPER = 36
# How long the runner waits for what it SIGKILLed to go before it writes the exit code all the same.
KILL_WAIT_SECONDS = 5.0
LEFT_FILE = "left"  # in STATE_DIR: the pids the sweep could not kill, before exit_code
# How long the runner waits for the command to appear inside its sandbox before it goes on all the same.
SANDBOX_START_SECONDS = 30.0


def proc_start_time(pid: int) -> str:
    """The kernel's start time of a process, to tell it from a later process that reuses the pid."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# sun_path holds 108 bytes: a longer socket path is named through an open descriptor of its directory.
unix_address = local_exec.unix_address


def notify(path: Path, message: bytes = b"exit") -> bool:
    """One datagram to the Unix socket ``path``, never blocking; False when nobody listens (the sync catches up)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s, unix_address(path) as address:
            s.setblocking(False)
            s.sendto(message, address)
        return True
    except OSError:  # no scheduler (ENOENT, ECONNREFUSED) or its queue is full (EAGAIN): a wake-up is already due
        return False


# --- the processes of a replica ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: str  # start time in clock ticks since boot: (pid, start) names one process, whatever reuses the pid


def live_process(pid: int) -> Proc | None:
    """A live process (zombies have ended and hold nothing), from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X", "x"):
        return None
    return Proc(pid, int(fields[1]), fields[19])


def processes(uids: Collection[int] = ()) -> dict[int, Proc]:
    """Every live process of this user (and of ``uids``: the sandboxes' user), by pid."""
    owners = {os.getuid(), *uids}
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid not in owners:
                continue
        except OSError:
            continue
        if (p := live_process(int(entry.name))) is not None:
            table[p.pid] = p
    return table


def marker_of(pid: int) -> str | None:
    """The replica marker a process was started with (its environment at exec), None when it has none."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    prefix = f"{MARKER}=".encode()
    for entry in env.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace")
    return None


def markers(table: dict[int, Proc]) -> dict[int, str]:
    """pid → replica marker, for the processes of ``table`` that carry one."""
    return {pid: m for pid in table if (m := marker_of(pid)) is not None}


def replica_processes(marker: str, *, table: dict[int, Proc] | None = None, tags: dict[int, str] | None = None,
                      runner: tuple[int, str] | None = None, uids: Collection[int] = ()) -> list[Proc]:
    """The live processes of one replica: each that carries its ``marker`` and, while its supervisor ``runner``
    (pid, start time) lives, each descendant of the supervisor, even one that dropped the marker from its
    environment (orphans are re-parented to the supervisor, a child subreaper). The supervisor is one of them."""
    table = processes(uids) if table is None else table
    tags = markers(table) if tags is None else tags
    found = {pid for pid, m in tags.items() if marker and m == marker and pid in table}
    if runner is not None and (r := table.get(runner[0])) is not None and r.start == runner[1]:
        children = defaultdict(list)
        for p in table.values():
            children[p.ppid].append(p.pid)
        stack, seen = [r.pid], {r.pid}
        while stack:
            pid = stack.pop()
            found.add(pid)
            for child in children[pid]:
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
    return [table[pid] for pid in sorted(found)]


def send(p: Proc, sig: int) -> bool:
    """Signal the process ``p`` names, never a later one that reuses its pid (checked through a pidfd)."""
    try:
        fd = os.pidfd_open(p.pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfd on this kernel: check the start time, then signal by pid
        fd = None
    try:
        now = live_process(p.pid)
        if now is None or now.start != p.start:
            return False
        if fd is None:
            os.kill(p.pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if fd is not None:
            os.close(fd)


def send_all(procs: Iterable[Proc], sig: int) -> int:
    return sum(send(p, sig) for p in procs)


# --- the supervisor ------------------------------------------------------------------------------------------------


def stop_requested(state: Path) -> int | None:
    """The signal a stop asked for before the command started (the ``stop`` file), None when none came."""
    try:
        return int((state / "stop").read_text().strip() or signal.SIGTERM)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return int(signal.SIGTERM)


def _default_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def reap_children(record: Callable[[int, int], None] = local_exec.REAPED.record) -> None:
    """Collect every child that has ended (orphans of the command are ours to collect, as subreaper), each
    (pid, status) told to ``record`` (the exec door's record of statuses; the launcher keeps none)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        record(pid, status)


def _wait(pid: int) -> int:
    """Wait for the command, collecting the orphans that end meanwhile; its exit code as a shell reports it."""
    while True:
        try:
            reaped, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        if reaped == pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code  # killed by signal N: 128+N
        local_exec.REAPED.record(reaped, status)  # an exec'd command's: its session reports it


def finder(marker: str, uids: Collection[int] = (), limiter: Limiter | None = None) -> Callable[[], list[Proc]]:
    """How the supervisor (the caller) finds the live processes of its replica, itself left out: the members of the
    replica's cgroup when it has one (a few files, and nothing leaves it unprivileged), else by its marker and as
    its own descendants, from the whole process table."""
    me = (os.getpid(), proc_start_time(os.getpid()))

    def find() -> list[Proc]:
        if limiter is not None and limiter.cgroup is not None:
            return [p for pid in sorted(limiter.cgroup.members()) if pid != me[0] and (p := live_process(pid))]
        return [p for p in replica_processes(marker, runner=me, uids=uids) if p.pid != me[0]]
    return find


def sweep(find: Callable[[], list[Proc]], grace: float) -> list[Proc]:
    """Kill what the command left behind (``find``: its processes, see ``finder``): SIGTERM, SIGKILL to what is still
    there ``grace`` seconds later. Returns what could not be killed (none, but for a process stuck in the kernel)."""
    deadline = time.monotonic() + grace
    termed: set[tuple[int, str]] = set()
    while True:
        reap_children()
        left = find()
        now = time.monotonic()
        if not left or now > deadline + KILL_WAIT_SECONDS:  # nothing left, or only what cannot be killed
            return left
        if now >= deadline:
            send_all(left, signal.SIGKILL)
        else:  # each once: a process that handles SIGTERM gets the grace period to act on it
            send_all([p for p in left if (p.pid, p.start) not in termed], signal.SIGTERM)
            termed.update((p.pid, p.start) for p in left)
        time.sleep(0.05)


def _wait_for_command(sandbox: int, find: Callable[[], list[Proc]]) -> None:
    """Until the command runs inside the sandbox: a process of the replica other than the supervisor, the sandbox
    and the sandbox's own init (its child, the first process of the new PID namespace). Also ends when the sandbox
    does (it could not start the command), or after SANDBOX_START_SECONDS whatever happened."""
    deadline = time.monotonic() + SANDBOX_START_SECONDS
    while live_process(sandbox) is not None and time.monotonic() < deadline:  # not reaped here: _wait does
        if any(p.pid != sandbox and p.ppid != sandbox for p in find()):
            return
        time.sleep(0.01)


def _copy(src, out) -> None:
    """The command's output, from the pipe into the log, until every process holding the pipe is gone."""
    while chunk := os.read(src.fileno(), 65536):
        out.write(chunk)


class Limiter:
    """The limits of one replica (``--limits``): its cgroup, RLIMIT_FSIZE, the disk watch, and why it ended."""

    def __init__(self, plan: cgroups.Plan | None, cwd: Path):
        self.plan, self.cwd = plan, cwd
        self.cgroup: cgroups.ReplicaCgroup | None = None  # once made
        self.watch: cgroups.DiskWatch | None = None
        self.evicted = ""  # the disk watch's message, once it killed the replica

    def create(self, out) -> bool:
        """Make the replica's cgroup; False when it cannot and limits are required (the command does not run)."""
        if self.plan is not None and self.plan.warning:
            out.write(f"jobsite: WARNING: {self.plan.warning}\n".encode())
        if self.plan is None or not self.plan.parents:
            return True
        cgroup = cgroups.ReplicaCgroup(self.plan)
        try:
            cgroup.create()
        except OSError as exc:
            out.write(f"jobsite: cannot set the replica's resource limits: {exc}\n".encode())
            cgroup.remove()
            return not self.plan.required
        self.cgroup = cgroup
        return True

    def enter(self) -> None:
        """In the command, between its fork and its exec."""
        if self.cgroup is not None:
            self.cgroup.join()
        if self.plan is not None and self.plan.limits.disk:
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.plan.limits.disk, self.plan.limits.disk))

    def watch_disk(self, find: Callable[[], list[Proc]]) -> None:
        if self.plan is None or not self.plan.limits.disk or self.plan.disk_check_seconds <= 0:
            return
        limit = self.plan.limits.disk

        def exceeded(used: int) -> None:  # as the kubelet evicts: at once, no grace period
            self.evicted = (f"Working directory usage ({cgroups.human(used)}) exceeds its limit of "
                            f"{cgroups.human(limit)}: the replica was killed")
            if self.cgroup is not None:
                self.cgroup.kill()
            else:
                send_all(find(), signal.SIGKILL)

        self.watch = cgroups.DiskWatch(self.cwd, limit, self.plan.disk_check_seconds, exceeded)
        self.watch.start()

    def reason(self, code: int) -> tuple[str, str] | None:
        """Why the replica ended, when a limit ended it: (reason, message)."""
        if self.watch is not None:
            self.watch.stop()
        if self.evicted:
            return "Evicted", self.evicted
        limits = self.plan.limits if self.plan is not None else cgroups.Limits()
        if self.cgroup is not None and limits.memory and self.cgroup.oom_killed(code):
            return "OOMKilled", (f"The kernel's OOM killer ended a process of the replica: it used all of its "
                                 f"memory limit of {cgroups.human(limits.memory)}")
        if limits.disk and code == cgroups.XFSZ_EXIT:
            return "Evicted", (f"A file of the replica reached its working directory's limit of "
                               f"{cgroups.human(limits.disk)} (SIGXFSZ): the replica was killed")
        return None

    def end(self) -> None:
        """Kill whatever is left in the cgroup and remove it."""
        if self.cgroup is not None:
            self.cgroup.kill(KILL_WAIT_SECONDS)
            reap_children()
            self.cgroup.remove()


def supervise(state: Path, log: Path, cwd: Path, argv: list[str], grace: float,
              sandbox_uid: int | None = None, notify_path: Path | None = None,
              plan: cgroups.Plan | None = None, sandbox_gid: int | None = None,
              network: str | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: None)  # we stay to kill what is left and record the exit
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    marker = os.environ.get(MARKER, "")
    uids = () if sandbox_uid is None else (sandbox_uid,)
    sandboxed = sandbox_uid is not None
    copier = None
    door = None  # the exec socket (local_exec.py), while the sandbox runs
    limiter = Limiter(plan, cwd)
    find = finder(marker, uids, limiter)
    for stale in ("reason", LEFT_FILE):  # a relaunch in place: the last run's
        (state / stale).unlink(missing_ok=True)
    write_atomic(state / "runner.pid", f"{os.getpid()} {proc_start_time(os.getpid())}")
    with open(log, "ab", buffering=0) as out, open(os.devnull, "rb") as devnull:
        if (sig := stop_requested(state)) is not None:  # stopped before it started: it never runs
            out.write(b"jobsite: stopped before the command started\n")
            code = 128 + sig
        elif not limiter.create(out):
            code = 127
        else:
            def preexec() -> None:
                _default_signals()
                limiter.enter()

            try:
                child = netns_sys.popen(argv, network, preexec, cwd=cwd, stdin=devnull,
                                        stdout=subprocess.PIPE if sandboxed else out, stderr=subprocess.STDOUT)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                out.write(f"jobsite: cannot start the command: {exc}\n".encode())
                code = 127
            else:
                if sandboxed:
                    copier = threading.Thread(target=_copy, args=(child.stdout, out), daemon=True)
                    copier.start()
                    write_atomic(state / "sandbox.pid", f"{child.pid} {proc_start_time(child.pid)}")
                    # A stop spares the sandbox's own processes: it must see the command, so the command is
                    # born before the stop file is looked at again.
                    _wait_for_command(child.pid, find)
                    door = _open_door(state, child.pid, sandbox_uid, sandbox_gid, limiter)
                write_atomic(state / "child.pid", str(child.pid))
                if (sig := stop_requested(state)) is not None:  # a stop came while it started: it may have
                    os.kill(child.pid, sig)  # found only us (not reaped yet: the pid is still the child's)
                limiter.watch_disk(find)
                code = child.returncode = _wait(child.pid)
        if door is not None:
            door.close()
        reason = limiter.reason(code)
        if survivors := sweep(find, grace):  # the scheduler looks for them itself (observe)
            write_atomic(state / LEFT_FILE, " ".join(str(p.pid) for p in survivors))
        reap_children()
        limiter.end()
        if copier is not None:  # the sandbox is gone, and all that held the pipe with it
            copier.join(KILL_WAIT_SECONDS)
    if reason is not None:
        write_atomic(state / "reason", json.dumps({"reason": reason[0], "message": reason[1]}))
    write_atomic(state / "exit_code", str(code))
    if notify_path is not None:  # after the exit code is there to read: the sync it starts finds it
        notify(notify_path)
    return code


def _open_door(state: Path, sandbox: int, uid: int, gid: int | None, limiter: Limiter):
    """The replica's exec socket (``exec.sock`` in its state directory); None when it cannot be opened."""
    try:
        return local_exec.ExecServer(state / local_exec.SOCKET_NAME, lambda: sandbox, uid=uid,
                                     gid=uid if gid is None else gid, privileged=os.geteuid() == 0,
                                     env=dict(os.environ), enter=limiter.enter).start()
    except OSError:
        return None


def _become_subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: orphans go to init, the marker still finds them
        pass


USAGE = ("usage: local_runner.py [--grace SECONDS] [--sandboxed UID] [--notify SOCKET] [--limits PLAN] "
         "[--network HOLDER[:user]] STATE LOG CWD -- ARGV...")


def main(started: Callable[[], None] | None = None) -> None:
    args = sys.argv[1:]
    options = {"--grace": "10", "--sandboxed": None, "--notify": None, "--limits": None, "--network": None}
    while args[:1] and args[0] in options and len(args) > 1:  # in any order
        options[args[0]], args = args[1], args[2:]
    if len(args) < 5 or args[3] != "--":
        raise SystemExit(USAGE)
    grace = float(options["--grace"])
    sandbox_uid = sandbox_gid = None
    if options["--sandboxed"] is not None:  # UID or UID:GID
        uid_text, _, gid_text = options["--sandboxed"].partition(":")
        sandbox_uid, sandbox_gid = int(uid_text), int(gid_text) if gid_text else None
    notify_path = None if options["--notify"] is None else Path(options["--notify"])
    plan = None if options["--limits"] is None else cgroups.Plan.from_json(options["--limits"])
    state, log, cwd, argv = *(Path(a) for a in args[:3]), args[4:]
    if started is None and os.fork() > 0:
        os._exit(0)  # the scheduler reaps this parent at once; the supervisor is adopted by init
    os.setsid()  # session and process group leader: the command and all it starts are in its group
    _become_subreaper()
    if started is not None:  # forked by the launcher: told, it collects this process when it ends
        started()
    os.chdir("/")
    fd = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(fd, std)
    try:
        supervise(state, log, cwd, argv, grace, sandbox_uid, notify_path, plan, sandbox_gid, options["--network"])
    finally:
        os._exit(0)


if __name__ == "__main__":
    main()
