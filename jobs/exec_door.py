"""The site's end of a local replica's exec socket (the supervisor's end: scheduler/backends/local_exec.py).

The socket is ``state/job-<id>/attempt-<n>/replica-<r>/exec.sock`` under the local backend's root (the attempt's
``backend_data["root"]``, else JOBSITE_LOCAL_ROOT): one JSON request line; the answer is one JSON line with the
command's descriptors attached (the terminal's end, or stdin, stdout and stderr), then ``{"exit": code}`` when it
ends. Closing the socket kills the command.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

SOCKET_NAME = "exec.sock"


class DoorClosed(Exception):
    """The replica has no exec socket open (not sandboxed, not started, or ended), or it refused the command."""


@dataclass
class Door:
    """One command running in a replica: its descriptors (``tty``: one, the terminal; else stdin, stdout, stderr)
    and the socket its exit code comes on."""

    sock: socket.socket
    fds: list[int]
    tty: bool
    pid: int = 0
    buffer: bytes = field(default=b"", repr=False)

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        self.sock.close()


def socket_path(*, root: str, job_id: int, attempt_number: int, rank: int) -> Path:
    base = Path(root or settings.JOBSITE_LOCAL_ROOT)
    return base / "state" / f"job-{job_id}" / f"attempt-{attempt_number}" / f"replica-{rank}" / SOCKET_NAME


def open_door(path: Path, *, command: list[str], tty: bool, rows: int = 24, cols: int = 80,
              timeout: float = 30.0) -> Door:
    """Start ``command`` in the replica whose exec socket is ``path`` (blocking: call it from a thread)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        with _address(path) as address:
            sock.connect(address)
        sock.sendall(json.dumps({"command": command, "tty": tty, "rows": rows, "cols": cols}).encode() + b"\n")
        data, fds, _flags, _addr = socket.recv_fds(sock, 65536, 3)
        line, _, rest = data.partition(b"\n")
        answer = json.loads(line or b"{}")
    except (OSError, ValueError) as exc:
        sock.close()
        raise DoorClosed(f"the replica cannot be entered: {exc}") from exc
    if "error" in answer or not fds:
        for fd in fds:
            os.close(fd)
        sock.close()
        raise DoorClosed(f"the replica cannot be entered: {answer.get('error', 'no answer')}")
    sock.settimeout(None)
    return Door(sock=sock, fds=list(fds), tty=bool(answer.get("tty")), pid=int(answer.get("pid", 0)), buffer=rest)


@contextlib.contextmanager
def _address(path: Path):
    if len(os.fsencode(path)) <= 107:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def exit_code(data: bytes) -> int | None:
    """The exit code in the supervisor's last line, None when it sent none (it went away)."""
    for line in data.splitlines():
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            code = json.loads(line).get("exit")
            if isinstance(code, int):
                return code
    return None


def connect_port(path: Path, port: int, timeout: float = 30.0) -> socket.socket:
    """A TCP connection to ``port`` of the replica's own 127.0.0.1, made by its supervisor from inside the job's
    network (blocking: call it from a thread). DoorClosed when nothing listens there or the replica has ended."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        with _address(path) as address:
            sock.connect(address)
        sock.sendall(json.dumps({"connect": port}).encode() + b"\n")
        data, fds, _flags, _addr = socket.recv_fds(sock, 4096, 1)
    except (OSError, ValueError) as exc:
        raise DoorClosed(f"port {port} of the job cannot be reached: {exc}") from exc
    finally:
        sock.close()
    if not fds:
        raise DoorClosed(f"port {port} of the job cannot be reached: {data.decode(errors='replace').strip()}")
    return socket.socket(fileno=fds[0])
