"""The web processes' event loop: a process takes a new connection only while it has a thread free for its request.

With several web processes behind one port (``jobsite.serve_web``, ``JOBSITE_WEB_WORKERS``) each process's event loop
is woken for a new connection on the shared socket, and asyncio's own server then takes every connection waiting
(up to the backlog) in one go, whatever the process has queued already. Under load the processes' queues drift
apart: measured with 50 back-to-back submitters on two processes, one held a median of 27 requests waiting for or
in its threads while the other held 14, and a request's wait followed the queue it happened to land in (p95 of a
submit 2.4 times its median).

Here the loop (``GatedLoop``, uvicorn's ``--loop``) takes a shared socket's connections itself: one at a time, and
only while the process has fewer than ``JOBSITE_WEB_THREADS`` requests in hand. A request counts from its body's
read to the end of its thread's work (the Django handler's ``in_hand``); a connection
taken counts until a request or WebSocket of the site begins (``answered``, from the ASGI app), for at most
``UNANSWERED_S``; a response being sent, a WebSocket, an idle keep-alive connection do not count. The connections
beyond wait in the port's queue, in order, for whichever process has room first: one queue for all the processes,
not one each. A server that binds its own socket (one process: ``--workers 1``) is left to asyncio, as is any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from collections.abc import Iterator
from functools import cache

log = logging.getLogger(__name__)

RETRY_AFTER_ERROR_S = 1.0  # as asyncio: after an accept error (too many open files), try again in a second
UNANSWERED_S = 1.0  # how long a connection taken counts before its first request or WebSocket begins


@cache
def limit() -> int:
    from django.conf import settings

    return settings.JOBSITE_WEB_THREADS


class _Gate:
    """Takes the connections of one listening socket, one per wake-up, while its loop has room."""

    def __init__(self, loop: GatedLoop, sock: socket.socket, protocol_factory, ssl) -> None:
        self.loop, self.sock, self.protocol_factory, self.ssl = loop, sock, protocol_factory, ssl
        self.reading = False
        sock.setblocking(False)

    def open(self) -> None:
        if not self.reading and self.sock.fileno() != -1:  # the server closes the socket when it stops
            self.loop.add_reader(self.sock.fileno(), self._accept)
            self.reading = True

    def shut(self) -> None:
        if self.reading:
            self.reading = False
            if self.sock.fileno() != -1:
                self.loop.remove_reader(self.sock.fileno())

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # another process took it, or its client gave up
        except OSError as exc:
            log.error("web: accepting a connection failed (%s); trying again in %g s", exc, RETRY_AFTER_ERROR_S)
            self.shut()
            self.loop.call_later(RETRY_AFTER_ERROR_S, self.loop.reopen)
            return
        conn.setblocking(False)
        self.loop.create_task(self._connect(conn))
        self.loop.taken()

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.protocol_factory, conn, ssl=self.ssl)
        except Exception as exc:  # the client went away before the connection was set up, or TLS failed
            log.debug("web: a connection could not be set up (%s)", exc)
            conn.close()


try:  # libuv's loop (uvloop, in requirements.txt), as uvicorn picks it by itself when it is installed
    from uvloop import Loop as _BaseLoop
except ImportError:  # pragma: no cover - asyncio's own
    _BaseLoop = asyncio.SelectorEventLoop


class GatedLoop(_BaseLoop):
    """The event loop (uvloop's, as uvicorn's standard install has it: with 50 submitters, each on a connection of
    its own, a submit's web CPU was 4 % less, the median of four runs alternating, within this machine's swings),
    whose servers on a given socket take connections through a ``_Gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0  # requests waiting for or in this process's threads
        self._taken: deque[float] = deque()  # until when each connection taken and not yet answered counts
        self._gates: list[_Gate] = []
        self._recheck: asyncio.TimerHandle | None = None

    async def create_server(self, protocol_factory, host=None, port=None, *, sock=None, ssl=None, **kwargs):
        if sock is None:  # a server that binds its own socket: asyncio's
            return await super().create_server(protocol_factory, host, port, ssl=ssl, **kwargs)
        # asyncio's server, not serving: it still closes the socket (and removes the gate's reader) when closed.
        server = await super().create_server(protocol_factory, sock=sock, ssl=ssl, **{**kwargs, "start_serving": False})
        sock.listen(kwargs.get("backlog", 100))  # what asyncio's server does when it starts serving
        self._gates.append(_Gate(self, sock, protocol_factory, ssl))
        self.reopen()
        log.info("web: this process takes connections on %s while it has fewer than %d requests in hand",
                 sock.getsockname(), limit())
        return server

    @property
    def busy(self) -> int:
        """The requests in hand and the connections taken whose first request has not begun (each for at most
        ``UNANSWERED_S``: a connection that sends nothing does not hold the process's room for long)."""
        now = self.time()
        while self._taken and self._taken[0] <= now:
            self._taken.popleft()
        return self.requests + len(self._taken)

    def reopen(self) -> None:
        """Take connections while the process has room; none while it is full (looked at again when the oldest
        connection taken stops counting)."""
        room = self.busy < limit()
        for gate in self._gates:
            gate.open() if room else gate.shut()
        if not room and self._taken and self._recheck is None:
            self._recheck = self.call_at(self._taken[0], self._rechecked)

    def _rechecked(self) -> None:
        self._recheck = None
        self.reopen()

    def taken(self) -> None:
        self._taken.append(self.time() + UNANSWERED_S)
        self.reopen()

    def answered(self) -> None:
        if self._taken:
            self._taken.popleft()
            self.reopen()

    def request_began(self) -> None:
        self.requests += 1
        self.reopen()

    def request_ended(self) -> None:
        self.requests -= 1
        self.reopen()


def _gated() -> GatedLoop | None:
    loop = asyncio.get_running_loop()
    return loop if isinstance(loop, GatedLoop) else None


def answered() -> None:
    """A connection's request or WebSocket began (the ASGI app calls it on the loop, for each): one connection taken
    no longer counts as such (a request counts on its own while in hand)."""
    if loop := _gated():
        loop.answered()


@contextlib.contextmanager
def in_hand() -> Iterator[None]:
    """A request of the running loop's process in hand (the handler's body read and thread work, on the loop)."""
    loop = _gated()
    if loop:
        loop.request_began()
    try:
        yield
    finally:
        if loop:
            loop.request_ended()
