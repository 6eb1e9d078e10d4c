"""What the web and the Kubernetes gateway (scheduler/gateway, ``manage.py rungateway``) say to each other over TCP.

1. The web connects to JOBSITE_GATEWAY_URL (``host:port``) and sends one line: a ticket, signed with the site's key
   (``django.core.signing``, salt ``SALT``), valid for ``TICKET_SECONDS`` and once (its nonce), naming the
   installation (JOBSITE_INSTALLATION_ID), the replica (``job``, ``attempt``, ``rank``) and what to open:
   ``command`` (a list; ``tty``, ``rows``, ``cols``) or ``port``.
2. The gateway answers one JSON line: ``{"ok": true}``, or ``{"error": message, "status": HTTP status}`` and closes
   (403 a ticket refused or a pod not of this installation, 404 no such pod, 409 not running, 502 the API failed).
3. Then, for a port: the connection is the TCP stream of the pod's port, raw bytes both ways, until either closes.
   For a command: frames both ways, each ``channel`` (1 byte), length (4 bytes, big-endian), data; the channels are
   Kubernetes' ``v4.channel.k8s.io``: 0 stdin and 4 resize (JSON ``{"Width", "Height"}``) from the web, 1 stdout,
   2 stderr and 3 status from the gateway; status, last, is JSON ``{"exit": code}`` (null when the command's end
   is unknown, with a ``message``), and the gateway closes. Closing the connection ends the command's session.

The web holds no cluster credentials; the gateway holds only ``pods`` get, ``pods/exec`` and ``pods/portforward``.
"""

from __future__ import annotations

import json
import secrets
import socket
import struct

from django.conf import settings
from django.core import signing

SALT = "jobsite.gateway.ticket"
TICKET_SECONDS = 30
MAX_LINE = 16384
MAX_FRAME = 1 << 20
STDIN, STDOUT, STDERR, STATUS, RESIZE = 0, 1, 2, 3, 4
HEADER = struct.Struct(">BI")


class TicketRefused(Exception):
    """A ticket that is not the site's, altered, expired, already used or malformed."""


def ticket_sign(*, job: int, attempt: int, rank: int, command: list[str] | None = None, tty: bool = False,
                rows: int = 24, cols: int = 80, port: int | None = None) -> str:
    payload = {"job": job, "attempt": attempt, "rank": rank, "nonce": secrets.token_urlsafe(12),
               "installation": settings.JOBSITE_INSTALLATION_ID}
    if port is not None:
        payload["port"] = int(port)
    else:
        payload.update(command=list(command or []), tty=bool(tty), rows=int(rows), cols=int(cols))
    return signing.dumps(payload, salt=SALT)


def ticket_read(ticket: str, *, max_age: float = TICKET_SECONDS) -> dict:
    """The ticket's request; TicketRefused when it is not one the site signed in the last ``max_age`` seconds or
    does not name a replica and exactly one of a command and a port."""
    try:
        payload = signing.loads(ticket, salt=SALT, max_age=max_age)
    except signing.SignatureExpired as exc:
        raise TicketRefused("the ticket has expired") from exc
    except signing.BadSignature as exc:
        raise TicketRefused("the ticket is not the site's") from exc
    if not isinstance(payload, dict):
        raise TicketRefused("the ticket names nothing")
    ints = ("job", "attempt", "rank")
    if not all(isinstance(payload.get(k), int) and payload[k] >= 0 for k in ints):
        raise TicketRefused("the ticket names no replica")
    if not isinstance(payload.get("nonce"), str) or not payload["nonce"]:
        raise TicketRefused("the ticket has no nonce")
    port, command = payload.get("port"), payload.get("command")
    if (port is None) == (command is None):
        raise TicketRefused("the ticket names neither a command nor a port")
    if port is not None and not (isinstance(port, int) and 0 < port < 65536):
        raise TicketRefused("the ticket's port is not a port")
    if command is not None and not (command and all(isinstance(a, str) for a in command)):
        raise TicketRefused("the ticket's command is not a command")
    return payload


def frame(channel: int, data: bytes = b"") -> bytes:
    return HEADER.pack(channel, len(data)) + data


def read_line(sock: socket.socket) -> bytes:
    """One line from a blocking socket, read byte by byte so that nothing after it is consumed."""
    line = b""
    while not line.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte:
            raise ConnectionError("closed before the end of the line")
        line += byte
        if len(line) > MAX_LINE:
            raise ConnectionError("line too long")
    return line


def answer(line: bytes) -> dict:
    try:
        value = json.loads(line)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"error": "the gateway's answer is not JSON", "status": 502}
