"""``ws/jobs/<id>/exec/?rank=N&command=...&command=...&tty=1&rows=R&cols=C``: a command inside a running replica.

Frames are binary, each a channel byte then data, as Kubernetes' ``v4.channel.k8s.io``: 0 stdin (client to server;
an empty one closes stdin), 1 stdout, 2 stderr, 3 status (server to client, last: JSON ``{"status": "Success"}`` or
``{"status": "Failure", "reason", "message", "exit_code"?, "code"?}``), 4 resize (client: JSON ``{"Width",
"Height"}``). With ``tty`` the command has a terminal (stdout carries it all). No command: a login shell.

The user comes from the session (the browser) or ``Authorization: Token <key>`` (jobctl). Refusals are a status
frame then a close with 4000 + the HTTP status: 4404 for a job the user may not see, 4409 for one not Running, 4400.
The session ends when the command exits, the client goes, the job stops Running, or after
JOBSITE_EXEC_IDLE_SECONDS with no byte either way; it leaves one event on the job's trail. A local replica is entered
through its supervisor's socket (``exec_door``), a Kubernetes pod through the gateway (``gateway_door``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth.models import AnonymousUser

from . import exec_door, gateway_door
from .services import sessions

STDIN, STDOUT, STDERR, STATUS, RESIZE = 0, 1, 2, 3, 4
DEFAULT_SHELL = ["/bin/sh", "-c", "exec \"$(command -v bash || echo /bin/sh)\" -l"]


def token_user(scope) -> object:
    from rest_framework import exceptions

    from .api.auth import ExpiringTokenAuthentication

    headers = dict(scope.get("headers") or [])
    kind, _, key = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    if kind.lower() != "token" or not key.strip():
        return AnonymousUser()
    try:
        return ExpiringTokenAuthentication().authenticate_credentials(key.strip())[0]
    except exceptions.AuthenticationFailed:
        return AnonymousUser()


class ExecConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        self.door: exec_door.Door | gateway_door.RemoteExec | None = None
        self.tasks: list[asyncio.Task] = []
        self.out: asyncio.Queue = asyncio.Queue()
        self.last = time.monotonic()
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.tty = query.get("tty", ["0"])[-1] in ("1", "true")
        self.command = query.get("command") or (DEFAULT_SHELL if self.tty else [])
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            user = await database_sync_to_async(token_user)(self.scope)
        self.user = user
        try:
            rank = int(query.get("rank", ["0"])[-1])
            if not self.command:
                raise sessions.SessionRefused(400, "bad_command", "No command given.")
            self.target = await database_sync_to_async(sessions.session_target)(
                user=user, job_id=int(self.scope["url_route"]["kwargs"]["pk"]), rank=rank)
        except ValueError:
            return await self._refuse(400, "BadRequest", "rank must be a number.")
        except sessions.SessionRefused as refused:
            return await self._refuse(refused.status, refused.reason, refused.message)
        rows, cols = (int(query.get(k, [d])[-1] or d) for k, d in (("rows", "24"), ("cols", "80")))
        try:
            self.door = await self._open(rows, cols)
        except exec_door.DoorClosed as exc:
            return await self._refuse(409, "not_running", str(exc))
        self.started = time.monotonic()
        self.ended = "closed"
        self.exit: int | None = None
        sessions.session_opened()
        if isinstance(self.door, gateway_door.RemoteExec):  # a pod, through the gateway: frames, not descriptors
            self.tasks = [asyncio.create_task(self._send_out()), asyncio.create_task(self._from_gateway()),
                          asyncio.create_task(self._watch())]
            return
        loop = asyncio.get_running_loop()
        outputs = self.door.fds[:1] if self.door.tty else self.door.fds[1:]
        for channel, fd in zip((STDOUT, STDERR), outputs, strict=False):
            os.set_blocking(fd, False)
            loop.add_reader(fd, self._readable, fd, channel)
        self.tasks = [asyncio.create_task(self._send_out()), asyncio.create_task(self._wait_exit()),
                      asyncio.create_task(self._watch())]

    async def _open(self, rows: int, cols: int):
        """The door into the replica: a Kubernetes pod's through the gateway, else the local supervisor's socket."""
        if gateway_door.applies(self.target):
            return await gateway_door.open_exec(self.target, command=self.command, tty=self.tty, rows=rows, cols=cols)
        path = exec_door.socket_path(root=self.target.backend_root, job_id=self.target.job.pk,
                                     attempt_number=self.target.attempt.number, rank=self.target.rank)
        return await sync_to_async(exec_door.open_door, thread_sensitive=False)(
            path, command=self.command, tty=self.tty, rows=rows, cols=cols)

    async def _refuse(self, status: int, reason: str, message: str) -> None:
        await self.send(bytes_data=bytes([STATUS]) + json.dumps(
            {"status": "Failure", "reason": reason, "code": status, "message": message}).encode())
        await self.close(code=4000 + status)

    # --- the command's output ------------------------------------------------------------------------------

    def _readable(self, fd: int, channel: int) -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: the terminal's other end is closed
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(fd)
            return
        self.last = time.monotonic()
        self.out.put_nowait(bytes([channel]) + data)

    def _drain(self) -> None:
        """What the command wrote before it ended and is not sent yet."""
        outputs = self.door.fds[:1] if self.door.tty else self.door.fds[1:]
        for channel, fd in zip((STDOUT, STDERR), outputs, strict=False):
            asyncio.get_running_loop().remove_reader(fd)
            while True:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    break
                if not data:
                    break
                self.out.put_nowait(bytes([channel]) + data)

    async def _send_out(self) -> None:
        while (frame := await self.out.get()) is not None:
            await self.send(bytes_data=frame)

    async def _wait_exit(self) -> None:
        loop = asyncio.get_running_loop()
        self.door.sock.setblocking(False)
        data = self.door.buffer
        while exec_door.exit_code(data) is None:
            try:
                chunk = await loop.sock_recv(self.door.sock, 4096)
            except OSError:
                chunk = b""
            if not chunk:
                break
            data += chunk
        self.exit = exec_door.exit_code(data)
        await self._finish("exited" if self.exit is not None else "ended")

    async def _from_gateway(self) -> None:
        """The pod's output as the gateway relays it, until its status frame (the exit code) or its close."""
        status = b""
        while (message := await self.door.read()) is not None:
            channel, data = message
            if channel == STATUS:
                status = data
                break
            if channel in (STDOUT, STDERR) and data:
                self.last = time.monotonic()
                self.out.put_nowait(bytes([channel]) + data)
        self.exit = gateway_door.exit_code(status)
        await self._finish("exited" if self.exit is not None else "ended")

    async def _watch(self) -> None:
        """The job still Running, and bytes still flowing."""
        idle, check = settings.JOBSITE_EXEC_IDLE_SECONDS, settings.JOBSITE_EXEC_CHECK_SECONDS
        while True:
            await asyncio.sleep(min(check, idle))
            if time.monotonic() - self.last > idle:
                return await self._finish("idle", f"closed after {idle:.0f} s without input or output")
            if not await database_sync_to_async(sessions.session_still_running)(self.target):
                return await self._finish("job ended", "the job is no longer Running")

    async def _finish(self, ended: str, message: str = "") -> None:
        if self.door is None or getattr(self, "finished", False):
            return
        self.finished, self.ended = True, ended
        current = asyncio.current_task()
        if self.exit is not None and isinstance(self.door, exec_door.Door):
            self._drain()
        status = {"status": "Success"} if self.exit == 0 else {
            "status": "Failure", "reason": "NonZeroExitCode" if self.exit is not None else ended,
            "message": message or (f"command terminated with exit code {self.exit}" if self.exit is not None
                                   else f"session {ended}"),
            **({"exit_code": self.exit} if self.exit is not None else {})}
        self.out.put_nowait(bytes([STATUS]) + json.dumps(status).encode())
        self.out.put_nowait(None)
        sender = self.tasks[0]
        for task in self.tasks[1:]:
            if task is not current:
                task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(sender), timeout=30)
        await self._close_door()
        await self.close(code=1000)

    async def _close_door(self) -> None:
        door, self.door = self.door, None
        if door is None:
            return
        loop = asyncio.get_running_loop()
        for fd in getattr(door, "fds", ()):
            loop.remove_reader(fd)
        door.close()  # the supervisor kills a command still running
        await database_sync_to_async(sessions.session_record)(
            target=self.target, user=self.user, command=self.command, tty=self.tty,
            seconds=time.monotonic() - self.started, exit_code=self.exit, ended=self.ended)

    # --- the client's input ---------------------------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None) -> None:
        if self.door is None or not bytes_data:
            return
        self.last = time.monotonic()
        channel, data = bytes_data[0], bytes_data[1:]
        if isinstance(self.door, gateway_door.RemoteExec):
            if channel in (STDIN, RESIZE):
                await self.door.send(channel, data)
            return
        stdin = self.door.fds[0]
        if channel == STDIN and not data and not self.door.tty:
            with contextlib.suppress(OSError):
                os.close(stdin)
            self.door.fds[0] = os.open(os.devnull, os.O_RDONLY)  # a placeholder: fds keep their places
        elif channel == STDIN:
            with contextlib.suppress(OSError):
                await sync_to_async(_write_all, thread_sensitive=False)(stdin, data)
        elif channel == RESIZE and self.door.tty:
            with contextlib.suppress(ValueError, TypeError, OSError, AttributeError):
                size = json.loads(data)
                _set_size(stdin, int(size["Height"]), int(size["Width"]))

    async def disconnect(self, code: int) -> None:
        for task in self.tasks:
            task.cancel()
        self.finished = True
        await self._close_door()


def _write_all(fd: int, data: bytes) -> None:
    blocking = os.get_blocking(fd)
    os.set_blocking(fd, True)
    try:
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.set_blocking(fd, blocking)


def _set_size(fd: int, rows: int, cols: int) -> None:
    import fcntl
    import struct
    import termios

    rows, cols = max(1, min(rows, 1000)), max(1, min(cols, 1000))
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
