"""The local backend's launcher: one long-lived process per installation (per JOBSITE_LOCAL_ROOT) that forks each
replica's supervisor from its preloaded modules, rather than a Python interpreter started per replica (issue 27).

    python launcher.py SOCKET [--idle SECONDS]

Standalone, as ``local_runner.py``: no Django. It imports the supervisor's modules (local_runner, cgroups,
local_exec, netns_sys) once, binds the Unix stream socket SOCKET (mode 0600, in the backend's state directory,
which no job sees), forks itself into the background (its own session: it outlives the scheduler that started it,
like the supervisors) and then serves one request at a time. A launch is what ``subprocess.Popen`` would have been
given: the supervisor's argv (``python local_runner.py ...``), its environment and the descriptors it must hold
(the attempt's network namespace, passed as SCM_RIGHTS). For each, the launcher forks a child that takes that
environment and runs ``local_runner.main()``, which detaches as the script does (a new session, the child
subreaper) but without the script's second fork: the launcher collects its children when they end. So the
supervisor is the same program with the same state files, exec socket, cgroup, sandbox and user as one started as
an interpreter, but it costs a fork instead of an interpreter's start and imports. The answer comes once the
supervisor exists (``{"ok": true}``) or could not be made (``{"error": ...}``: nothing started, the backend starts
it as an interpreter instead). A ``network`` request forks the holder of an attempt's network namespace
(netns_sys.py) and answers with its pid once the namespace is set up.

Only a peer of the launcher's own user is served. One launcher per socket: a lock file beside it
(``SOCKET.lock``) keeps a second from starting; the socket's name carries a digest of the five modules' source, so
a launcher of older code is never used: it exits once idle for ``--idle`` seconds, as any launcher does, or when
its socket is removed or taken over.

The client's side is ``Launcher`` (used by local.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

try:
    from . import local_exec, local_runner, netns_sys
except ImportError:  # run as a script (python launcher.py): its directory is on sys.path
    import local_exec  # type: ignore[no-redef]
    import local_runner  # type: ignore[no-redef]
    import netns_sys  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "local_runner.py"
SOURCES = ("launcher.py", "local_runner.py", "local_exec.py", "cgroups.py", "netns_sys.py")
MAX_MESSAGE = 16 << 20
MAX_FDS = 16
# How long a client waits for a launcher to start, and for the answer to one request.
START_SECONDS = 20.0
ANSWER_SECONDS = 30.0
# After a launcher failed to start, launches go to interpreters for this long before it is tried again.
RETRY_SECONDS = 60.0
TICK_SECONDS = 5.0  # how often an idle launcher looks whether it should go
_UCRED = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


@cache
def version() -> str:
    """A digest of the code a launcher runs: in its socket's name, so a changed supervisor gets a new launcher."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((HERE / name).read_bytes())
    return digest.hexdigest()[:12]


def socket_path(state_dir: Path) -> Path:
    return state_dir / f"launcher-{version()}.sock"


# --- messages: a 4-byte length, then JSON; the first part of a request carries its descriptors -----------------


def send_message(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(message).encode()
    data = struct.pack("!I", len(data)) + data
    sent = socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
    if sent < len(data):  # never an empty send: to a peer that has read it all and gone, that is EPIPE
        sock.sendall(data[sent:])


def recv_message(sock: socket.socket) -> tuple[dict, list[int]]:
    """One message and the descriptors that came with it (closed here when the message is bad)."""
    data, fds, _flags, _addr = socket.recv_fds(sock, 65536, MAX_FDS)
    try:
        while len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:
            if len(data) >= 4 and struct.unpack("!I", data[:4])[0] > MAX_MESSAGE:
                raise ValueError("message too long")
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the peer closed the connection mid-message")
            data += chunk
        message = json.loads(data[4:])
        if not isinstance(message, dict):
            raise ValueError("not a JSON object")
        return message, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


# --- the launcher ------------------------------------------------------------------------------------------------


class Server:
    """The launcher's loop: single-threaded, so that each fork copies a process with no other thread in it."""

    def __init__(self, path: Path, idle: float):
        self.path, self.idle = path, idle
        self.lock_fd = -1
        self.listener: socket.socket | None = None
        self.inode = 0

    def bind(self) -> bool:
        """Take the lock and bind the socket; False when another launcher holds the lock."""
        self.lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)  # never a moment when another user could connect
        try:
            with local_exec.unix_address(self.path) as address:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)  # left by a launcher that died
                listener.bind(address)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        listener.listen(64)
        self.listener, self.inode = listener, os.stat(self.path).st_ino
        return True

    def still_ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def serve(self) -> None:
        last = time.monotonic()
        while True:
            ready = select.select([self.listener], [], [], TICK_SECONDS)[0]
            if not ready:
                reap()
                if time.monotonic() - last > self.idle or not self.still_ours():
                    break
                continue
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            last = time.monotonic()
            reap()  # before the request: whoever asks finds the children that had ended collected
            with conn:
                if self.handle(conn) == "stop":
                    break
        if self.still_ours():
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def handle(self, conn: socket.socket) -> str:
        conn.settimeout(ANSWER_SECONDS)
        fds: list[int] = []
        try:
            _pid, uid, _gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            if uid != os.geteuid():
                send_message(conn, {"error": "refused: not the launcher's user"})
                return "refused"
            message, fds = recv_message(conn)
            op = message.get("op")
            if op == "stop":
                send_message(conn, {"ok": True})
                return "stop"
            if op == "ping":
                send_message(conn, {"ok": True, "pid": os.getpid(), "version": version()})
                return "ping"
            if op == "network":
                send_message(conn, self.network(message, fds, conn))
                return "network"
            send_message(conn, self.launch(message, fds, conn))
            return "launch"
        except (OSError, ValueError) as exc:
            with contextlib.suppress(OSError):
                send_message(conn, {"error": f"bad request: {exc}"})
            return "error"
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def launch(self, message: dict, fds: list[int], conn: socket.socket) -> dict:
        argv, env = message.get("argv"), message.get("env")
        if (not isinstance(argv, list) or len(argv) < 2 or not all(isinstance(a, str) for a in argv)
                or not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values())):
            return {"error": "a launch needs argv (python local_runner.py ...) and env"}
        if Path(argv[1]).resolve() != RUNNER:
            return {"error": f"this launcher starts {RUNNER}, not {argv[1]}"}
        try:
            pid, said = self._fork(conn, lambda report: _supervisor(argv, env, report))
        except OSError as exc:
            return {"error": f"cannot fork: {exc}"}
        if said != b"ok":  # it ended before it was the supervisor
            return {"error": f"the supervisor could not be started (exit {_wait_child(pid)})"}
        return {"ok": True}

    def network(self, message: dict, fds: list[int], conn: socket.socket) -> dict:
        """Fork the holder of an attempt's network namespace (netns_sys.hold), reading the pipe ``fds[0]``; its
        pid once the namespace is set up."""
        routes, env = message.get("routes"), message.get("env")
        if (len(fds) != 1 or not isinstance(routes, list) or not all(isinstance(r, str) for r in routes)
                or not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values())):
            return {"error": "a network needs routes, env and the attempt's pipe"}
        privileged = bool(message.get("privileged"))

        def holder(report: int) -> None:
            os.setsid()
            netns_sys.hold(privileged=privileged, routes=routes, stdin=fds[0], env=env, report=report)
        try:
            pid, said = self._fork(conn, holder)
        except OSError as exc:
            return {"error": f"cannot fork: {exc}"}
        if said:  # it said why and exited; else it is ``cat`` now
            _wait_child(pid)
            return {"error": f"the job's network namespace did not start: {said.decode(errors='replace')}"}
        return {"ok": True, "pid": pid}

    def _fork(self, conn: socket.socket, child: Callable[[int], None]) -> tuple[int, bytes]:
        """Fork a child that runs ``child(report)``, never returning into this loop; its pid and what it wrote on
        ``report``, a close-on-exec pipe, before closing it (by an exec, or at its end). The child is this
        process's own: it is reaped when it ends (``reap``), as the launcher's children all are, without a second
        fork per launch."""
        report_r, report_w = os.pipe2(os.O_CLOEXEC)
        try:
            pid = os.fork()
        except OSError:
            os.close(report_r)
            os.close(report_w)
            raise
        if pid == 0:
            try:
                for fd in (self.lock_fd, self.listener.fileno(), conn.fileno(), report_r):
                    os.close(fd)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)
                child(report_w)
            finally:  # anything: this child must never return into the launcher's loop
                os._exit(1)
        os.close(report_w)
        said = b""
        try:
            while chunk := os.read(report_r, 4096):
                said += chunk
        finally:
            os.close(report_r)
        return pid, said


def reap() -> None:
    """Collect the launcher's children that have ended (supervisors, holders)."""
    local_runner.reap_children(lambda pid, status: None)


def _wait_child(pid: int) -> int:
    while True:
        try:
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        except InterruptedError:
            continue


def _supervisor(argv: list[str], env: dict[str, str], report: int) -> None:
    """In the launcher's child (``_fork``, which ends it whatever happens): become what ``python local_runner.py
    ARGS`` with ``env`` would be, and run it, saying ``ok`` on ``report`` once it is the supervisor."""
    os.environ.clear()
    os.environ.update(env)
    sys.argv = argv[1:]

    def started() -> None:
        os.write(report, b"ok")
        os.close(report)
    local_runner.main(started=started)  # ends with os._exit


def main() -> None:
    args = sys.argv[1:]
    idle = 600.0
    if args[1:2] == ["--idle"] and len(args) > 2:
        idle, args = float(args[2]), args[:1]
    if len(args) != 1:
        raise SystemExit("usage: launcher.py SOCKET [--idle SECONDS]")
    server = Server(Path(args[0]), idle)
    if not server.bind():
        print("busy", flush=True)  # another launcher has the lock: the client connects to that one
        return
    if os.fork() > 0:  # the background launcher is ready (listening): its starter may go on
        print("ready", flush=True)
        os._exit(0)
    os.chdir("/")
    fd = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(fd, std)
    os.close(fd)
    # Every object made so far (the modules) out of the collector's reach: a child's collections would otherwise
    # walk them and write to each one's header, copying most of the launcher's pages into every supervisor.
    gc.freeze()
    try:
        server.serve()
    finally:
        os._exit(0)


# --- the client ----------------------------------------------------------------------------------------------


class Unavailable(OSError):
    """The launcher did not start the supervisor (none runs, none could be started, or it refused): nothing
    started, so the caller may start it another way."""


class NoAnswer(OSError):
    """The request was sent but no answer came: the supervisor may or may not have started."""


class Launcher:
    """The backend's handle on its launcher: started on first use (in the background: a launch never waits for
    it), found again by a later scheduler."""

    def __init__(self, state_dir: Path, *, idle: float, python: str = sys.executable):
        self.path = socket_path(state_dir)
        self.idle, self.python = idle, python
        self._lock = threading.Lock()
        self._starting = False
        self._retry_at = 0.0
        self.failure = ""  # why the last start failed, while no launcher answers
        self.seen = False  # a launcher has answered this client

    def launch(self, argv: list[str], env: dict[str, str], fds: tuple[int, ...] = ()) -> None:
        """Start the supervisor ``argv`` would be, with ``env`` and holding ``fds``; raises Unavailable (nothing
        started: when no launcher listens, one is started in the background for the next launches) or NoAnswer
        (unknown)."""
        try:
            answer = self.request({"op": "launch", "argv": argv, "env": env}, fds)
        except Unavailable as exc:
            raise Unavailable(f"{exc}; {self.start_soon()}") from exc
        if not answer.get("ok"):
            raise Unavailable(str(answer.get("error", "no reason given")))
        self.seen = True

    def hold_network(self, *, routes: list[str], privileged: bool, env: dict[str, str], stdin: int) -> int:
        """The pid of a holder of a new network namespace (netns_sys.hold) reading the pipe ``stdin``, set up with
        the prohibited ``routes``; Unavailable or NoAnswer when the launcher did not make one."""
        answer = self.request({"op": "network", "routes": routes, "privileged": privileged, "env": env}, (stdin,))
        if not answer.get("ok") or not isinstance(answer.get("pid"), int):
            raise Unavailable(str(answer.get("error", "no reason given")))
        return answer["pid"]

    def request(self, message: dict, fds: tuple[int, ...] = ()) -> dict:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(ANSWER_SECONDS)
            try:
                with local_exec.unix_address(self.path) as address:
                    sock.connect(address)
            except OSError as exc:  # none listens (ENOENT, ECONNREFUSED) or it cannot be reached
                raise Unavailable(f"no launcher at {self.path}: {exc.strerror or exc}") from exc
            try:
                send_message(sock, message, fds)
            except OSError as exc:  # it went before reading: nothing was started
                raise Unavailable(f"the launcher took no request: {exc}") from exc
            try:
                return recv_message(sock)[0]
            except (OSError, ValueError) as exc:
                raise NoAnswer(f"the launcher did not answer: {exc}") from exc

    def start_soon(self) -> str:
        """Start a launcher in a thread of this process unless one is starting or the last start failed less
        than RETRY_SECONDS ago; what it did, in words."""
        with self._lock:
            if self._starting:
                return "a launcher is starting"
            if (left := self._retry_at - time.monotonic()) > 0:
                return f"the last start failed ({self.failure}); next try in {left:.0f} s"
            self._starting = True
        threading.Thread(target=self._start_quietly, name="launcher-start", daemon=True).start()
        return "starting one"

    def _start_quietly(self) -> None:
        try:
            self.start()
        except Unavailable:
            pass  # the next launches say why (``failure``)

    def start(self) -> None:
        """Start a launcher and wait until it listens (or another one does); Unavailable when it cannot."""
        try:
            with contextlib.suppress(Unavailable, NoAnswer):
                if self.request({"op": "ping"}).get("ok"):  # another thread (or scheduler) started one meanwhile
                    return
            try:
                self._start()
            except Unavailable as exc:
                self.failure, self._retry_at = str(exc), time.monotonic() + RETRY_SECONDS
                raise
            self.failure, self._retry_at = "", 0.0
        finally:
            with self._lock:
                self._starting = False

    def _start(self) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": os.environ.get("LANG", "C.UTF-8")}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Its own session from its first instruction, as a supervisor: a kill of the scheduler's group never
            # takes it. It forks into the background once it listens: this process is reaped below.
            proc = subprocess.Popen([self.python, str(HERE / "launcher.py"), str(self.path), "--idle",
                                     str(self.idle)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, cwd="/", start_new_session=True)
        except OSError as exc:
            raise Unavailable(f"cannot start the launcher: {exc}") from exc
        try:
            out, err = proc.communicate(timeout=START_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise Unavailable(f"the launcher did not start within {START_SECONDS:.0f} s") from None
        said = out.decode(errors="replace").strip()
        if said == "busy":  # another one holds the lock: it listens, or is about to
            deadline = time.monotonic() + START_SECONDS
            while time.monotonic() < deadline:
                with contextlib.suppress(Unavailable, NoAnswer):
                    if self.request({"op": "ping"}).get("ok"):
                        return
                time.sleep(0.05)
            raise Unavailable("another launcher holds the lock but does not answer")
        if said != "ready":
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            raise Unavailable(f"the launcher did not start: {tail[0]}")

    def shutdown(self) -> bool:
        """Ask the launcher to exit (replicas are not touched); False when none answered."""
        try:
            return bool(self.request({"op": "stop"}).get("ok"))
        except (Unavailable, NoAnswer):
            return False


def shutdown_all(state_dir: Path) -> int:
    """Stop every launcher of a state directory, of whatever code version (tests, an installation removed)."""
    stopped = 0
    for path in Path(state_dir).glob("launcher-*.sock"):
        client = Launcher.__new__(Launcher)
        client.path = path
        stopped += client.shutdown()
    return stopped


if __name__ == "__main__":
    main()
