"""The door into a running local replica: its supervisor's exec socket. Standalone: no Django (the supervisor runs it).

Only the process that made the sandbox can enter it, so the supervisor of a sandboxed replica listens on a Unix
socket in its state directory (``exec.sock``, mode 0600: the server's user only; the state directory is hidden from
every job, so nothing inside a job can reach it). One connection is one command:

1. the site sends one JSON line: ``{"command": [...], "tty": bool, "rows": int, "cols": int}``;
2. the supervisor starts the command inside the replica's sandbox (``nsenter`` into the mount, PID, network, IPC and
   UTS namespaces of the sandbox's first process, its root and working directory, the replica's cgroup, then
   ``setpriv`` down to the sandbox's unprivileged user with no capabilities) with the replica's environment, on a
   new pseudo-terminal or on three pipes, and sends their site ends over the socket (SCM_RIGHTS) with one JSON
   line: ``{"pid": ..., "tty": ...}``, or ``{"error": "..."}`` when it cannot;
3. when the command ends it sends ``{"exit": code}`` and closes. When the site closes its end first, the command's
   process group is killed.

``{"connect": port}`` instead asks for a TCP connection to ``port`` on the replica's own 127.0.0.1 (its network
namespace is closed to the machine): the supervisor connects from inside it and sends the connected socket.

The site reads and writes the descriptors itself (resizing the terminal through its end), so the supervisor
copies no byte. Exec'd processes carry the replica's marker: a stop or the replica's end kills them too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import select
import signal
import socket
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

try:
    from . import netns_sys
except ImportError:  # run as a script's module (launcher.py, local_runner.py): their directory is on sys.path
    import netns_sys  # type: ignore[no-redef]

NSENTER = "/usr/bin/nsenter"
SETPRIV = "/usr/bin/setpriv"
# Inside the sandbox: makes the command the leader of a session whose terminal is its stdin, so that Ctrl-C
# reaches it and what it runs, not nsenter (which would die of it).
SETSID = "/usr/bin/setsid"
SOCKET_NAME = "exec.sock"
MAX_REQUEST = 65536


@contextlib.contextmanager
def unix_address(path: Path) -> Iterator[str]:
    """A name of the Unix socket ``path`` short enough to bind or connect to (sun_path holds 108 bytes): a longer
    one is named through an open descriptor of its directory."""
    if len(os.fsencode(path)) <= 107:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def exec_argv(target: int, command: list[str], *, uid: int, gid: int, privileged: bool,
              tty: bool = False) -> list[str]:
    """The command line that runs ``command`` inside the sandbox whose first process is ``target``: its namespaces,
    root and working directory; as root, then ``setpriv`` to uid/gid with no capabilities; else through its user
    namespace (where the server's user is mapped to uid/gid). ``tty``: in a session of its own on its terminal."""
    if tty:
        command = [SETSID, "--ctty", *command]
    argv = [NSENTER, f"--target={target}", "--mount", "--pid", "--net", "--ipc", "--uts", "--root", "--wd"]
    if not privileged:
        return [*argv, "--user", f"--setuid={uid}", f"--setgid={gid}", "--", *command]
    return [*argv, "--", SETPRIV, "--reuid", str(uid), "--regid", str(gid), "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--", *command]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def sandbox_init(root: int) -> int | None:
    """The first process of the sandbox started as ``root``: the first descendant in another PID namespace."""
    try:
        own = os.readlink(f"/proc/{root}/ns/pid")
    except OSError:
        return None
    queue = [root]
    while queue:
        pid = queue.pop(0)
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != own:
                return pid
        except OSError:
            continue
        queue += _children(pid)
    return None


def set_size(fd: int, rows: int, cols: int) -> None:
    """The window size of the terminal whose end ``fd`` is (either end)."""
    rows, cols = max(1, min(int(rows), 1000)), max(1, min(int(cols), 1000))
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Reaped:
    """Exit statuses of children reaped by someone else (the supervisor reaps every child it has, as subreaper)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._statuses: dict[int, int] = {}

    def record(self, pid: int, status: int) -> None:
        with self._lock:
            self._statuses[pid] = status

    def code(self, pid: int) -> int | None:
        """The exit code (128+N for signal N) of the ended child ``pid``; None while it runs."""
        with self._lock:
            if pid in self._statuses:
                status = self._statuses.pop(pid)
            else:
                try:
                    done, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # reaped by the supervisor: its status is recorded in a moment
                    return None
                if done == 0:
                    return None
        code = os.waitstatus_to_exitcode(status)
        return 128 - code if code < 0 else code


REAPED = Reaped()


class ExecServer:
    """The supervisor's exec socket (see the module's doc). ``root``: the sandbox's outer process, once started;
    ``enter``: run in each command between fork and exec (the replica's cgroup and limits)."""

    def __init__(self, path: Path, root: Callable[[], int | None], *, uid: int, gid: int, privileged: bool,
                 env: dict[str, str], enter: Callable[[], None] = lambda: None):
        self.path, self.root, self.enter = path, root, enter
        self.uid, self.gid, self.privileged, self.env = uid, gid, privileged, env
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        old = os.umask(0o177)
        try:
            with unix_address(path) as address:
                self._sock.bind(address)
        finally:
            os.umask(old)
        self._sock.listen(16)
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> ExecServer:
        self._thread.start()
        return self

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = self._read_request(conn)
                if "connect" in request:
                    return self._connect(conn, int(request["connect"]))
                child, ends, tty = self._spawn(request)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"error": str(exc)}).encode() + b"\n")
                return
            try:
                socket.send_fds(conn, [json.dumps({"pid": child.pid, "tty": tty}).encode() + b"\n"], ends)
            except OSError:
                pass
            finally:
                for fd in ends:
                    os.close(fd)
            code = self._wait(child, conn)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"exit": code}).encode() + b"\n")

    def _connect(self, conn: socket.socket, port: int) -> None:
        """A TCP connection to ``port`` of the replica's 127.0.0.1, made from inside its network namespace (this
        thread enters it, and ends with it), handed to the site."""
        root = self.root()
        target = sandbox_init(root) if root else None
        if target is None or not 0 < port < 65536:
            raise ValueError("the replica's sandbox is not running")
        namespaces = netns_sys.open_namespaces(target, user=False)
        try:
            netns_sys.enter(namespaces)  # this thread alone
        finally:
            netns_sys.close_namespaces(namespaces)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as upstream:
            socket.send_fds(conn, [b'{"connected": true}\n'], [upstream.fileno()])

    @staticmethod
    def _read_request(conn: socket.socket) -> dict:
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk or len(data) > MAX_REQUEST:
                raise ValueError("no request")
            data += chunk
        request = json.loads(data)
        if "connect" in request:
            return request
        command = request.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
            raise ValueError("the command must be a non-empty list of strings")
        return request

    def _spawn(self, request: dict) -> tuple[subprocess.Popen, list[int], bool]:
        root = self.root()
        target = sandbox_init(root) if root else None
        if target is None:
            raise ValueError("the replica's sandbox is not running")
        tty = bool(request.get("tty"))
        argv = exec_argv(target, request["command"], uid=self.uid, gid=self.gid, privileged=self.privileged, tty=tty)
        env = {**self.env, "TERM": str(request.get("term") or "xterm-256color")} if tty else dict(self.env)
        if tty:
            master, slave = pty.openpty()
            set_size(master, request.get("rows") or 24, request.get("cols") or 80)

            def preexec() -> None:
                os.setsid()  # no controlling terminal: the command takes it (SETSID)
                _default_signals()
                self.enter()

            try:
                child = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                         preexec_fn=preexec, close_fds=True)
            except BaseException:
                os.close(master)
                raise
            finally:
                os.close(slave)
            return child, [master], True

        def preexec_pipes() -> None:
            os.setsid()
            _default_signals()
            self.enter()

        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=env, preexec_fn=preexec_pipes, close_fds=True)
        ends = [os.dup(child.stdin.fileno()), os.dup(child.stdout.fileno()), os.dup(child.stderr.fileno())]
        for f in (child.stdin, child.stdout, child.stderr):
            f.close()
        return child, ends, False

    @staticmethod
    def _wait(child: subprocess.Popen, conn: socket.socket) -> int:
        """The command's exit code; kills its process group when the site hangs up first."""
        pidfd = os.pidfd_open(child.pid)
        try:
            while True:
                ready = select.select([pidfd, conn], [], [])[0]
                if pidfd in ready:
                    break
                if not conn.recv(64):  # the site went: so does the command
                    _kill_tree(child.pid)
                    select.select([pidfd], [], [])
                    break
        finally:
            os.close(pidfd)
        deadline = time.monotonic() + 10.0
        while (code := REAPED.code(child.pid)) is None:  # exited: reaped at once by us or by the supervisor
            if time.monotonic() > deadline:
                return 255
            select.select([], [], [], 0.01)
        return code


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and every descendant of it (the command's own session included)."""
    found, queue = [], [pid]
    while queue:
        p = queue.pop()
        found.append(p)
        queue += _children(p)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    for p in reversed(found):
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


def _default_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
