"""The site's way into a replica on Kubernetes: through the gateway (``manage.py rungateway``, the only process that
holds ``pods/exec`` and ``pods/portforward``), at JOBSITE_GATEWAY_URL; the web itself holds no cluster credentials.

The wire (a signed ticket, then frames or a raw stream) is ``jobs.gateway_wire``'s. ``connect_port`` returns a
connected socket as ``exec_door.connect_port`` does, so the port proxy and port-forward work unchanged; ``open_exec``
returns a ``RemoteExec`` whose frames carry the ``v4.channel.k8s.io`` channels the exec WebSocket speaks.
Failures are ``exec_door.DoorClosed``, as for a local replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from dataclasses import dataclass

from django.conf import settings

from . import gateway_wire as wire
from .exec_door import DoorClosed

BACKEND = "kubernetes"


def applies(target) -> bool:
    """Whether the session's replica is a Kubernetes pod (its attempt ran on that backend)."""
    return target.attempt.backend == BACKEND


def _address() -> tuple[str, int]:
    url = settings.JOBSITE_GATEWAY_URL.strip()
    host, _, port = url.removeprefix("tcp://").rpartition(":")
    if not url or not host or not port.isdigit():
        raise DoorClosed("exec and ports on Kubernetes go through the gateway, and JOBSITE_GATEWAY_URL names none")
    return host.strip("[]"), int(port)


def _refusal(reply: dict) -> DoorClosed:
    return DoorClosed(f"the replica cannot be entered: {reply.get('error', 'the gateway refused')}")


def connect_port(target, port: int, timeout: float = 30.0) -> socket.socket:
    """A connection to ``port`` of the target's pod through the gateway: after the gateway's answer, the raw bytes
    of the port (blocking: call it from a thread)."""
    ticket = wire.ticket_sign(job=target.job.pk, attempt=target.attempt.number, rank=target.rank, port=port)
    try:
        sock = socket.create_connection(_address(), timeout=timeout)
    except OSError as exc:
        raise DoorClosed(f"the gateway cannot be reached: {exc}") from exc
    try:
        sock.sendall(ticket.encode() + b"\n")
        reply = wire.answer(wire.read_line(sock))
    except OSError as exc:
        sock.close()
        raise DoorClosed(f"port {port} of the job cannot be reached: {exc}") from exc
    if not reply.get("ok"):
        sock.close()
        raise _refusal(reply)
    sock.settimeout(None)
    return sock


@dataclass
class RemoteExec:
    """A command running in a pod, as the gateway relays it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def read(self) -> tuple[int, bytes] | None:
        """The next (channel, data) from the gateway; None once it has closed."""
        try:
            head = await self.reader.readexactly(wire.HEADER.size)
            channel, length = wire.HEADER.unpack(head)
            return channel, await self.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    async def send(self, channel: int, data: bytes = b"") -> None:
        for start in range(0, max(len(data), 1), wire.MAX_FRAME):
            self.writer.write(wire.frame(channel, data[start:start + wire.MAX_FRAME]))
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()

    def close(self) -> None:
        self.writer.close()


async def open_exec(target, *, command: list[str], tty: bool, rows: int = 24, cols: int = 80,
                    timeout: float = 30.0) -> RemoteExec:
    ticket = wire.ticket_sign(job=target.job.pk, attempt=target.attempt.number, rank=target.rank, command=command,
                              tty=tty, rows=rows, cols=cols)
    host, port = _address()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=wire.MAX_LINE), timeout)
    except (OSError, TimeoutError) as exc:
        raise DoorClosed(f"the gateway cannot be reached: {exc}") from exc
    try:
        writer.write(ticket.encode() + b"\n")
        await writer.drain()
        reply = wire.answer(await asyncio.wait_for(reader.readline(), timeout))
    except (OSError, TimeoutError, ValueError) as exc:
        writer.close()
        raise DoorClosed(f"the replica cannot be entered: {exc}") from exc
    if not reply.get("ok"):
        writer.close()
        raise _refusal(reply)
    return RemoteExec(reader=reader, writer=writer)


def exit_code(status: bytes) -> int | None:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        code = json.loads(status).get("exit")
        if isinstance(code, int):
            return code
    return None
