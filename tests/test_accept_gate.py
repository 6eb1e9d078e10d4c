"""The web processes' loop (``jobsite.accept_gate``): a process takes a shared socket's connections one at a time and
only while it has fewer requests waiting for or in its threads than ``JOBSITE_WEB_THREADS``; the connections beyond
wait in the port's queue for a process with room (measured before: two processes took connections whatever they
had queued, one held twice the other's requests, and a submit's p95 was 2.4 times its median)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from jobsite import accept_gate
from jobsite.accept_gate import GatedLoop

TRANSPORTS: list[asyncio.Transport] = []


class Recorder(asyncio.Protocol):
    """A connection; with ``begins`` it counts as a request begun at once (as the handler would, a moment later)."""

    def __init__(self, made: list, begins: bool = False) -> None:
        self.made, self.begins = made, begins

    def connection_made(self, transport) -> None:
        self.made.append(transport)
        TRANSPORTS.append(transport)
        if self.begins:
            loop = asyncio.get_running_loop()
            loop.answered()
            loop.request_began()


@pytest.fixture
def listening():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


@pytest.fixture
def clients():
    made: list[socket.socket] = []

    def connect(sock: socket.socket, n: int) -> list[socket.socket]:
        for _ in range(n):  # the kernel completes the handshake into the port's queue, taken or not
            made.append(socket.create_connection(sock.getsockname(), timeout=30))
        return made

    yield connect
    for conn in made:
        conn.close()


def queued(sock: socket.socket) -> int:
    """Connections waiting in the listening socket's queue (its Recv-Q in /proc/net/tcp)."""
    port = f"{sock.getsockname()[1]:04X}"
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1].endswith(f":{port}") and fields[3] == "0A":  # LISTEN
                return int(fields[4].split(":")[1], 16)
    raise AssertionError("the listening socket is not in /proc/net/tcp")


def spin(loop: asyncio.AbstractEventLoop, until, timeout: float = 30.0) -> None:
    """Run ``loop`` until ``until()`` holds (a generous deadline)."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "the condition did not come true before the deadline"
        loop.run_until_complete(asyncio.sleep(0.01))


def settle(loop: asyncio.AbstractEventLoop) -> None:
    """Give ``loop`` its chances to take a waiting connection (each turn polls the selector)."""
    for _ in range(20):
        loop.run_until_complete(asyncio.sleep(0))


@pytest.fixture
def gated(monkeypatch):
    monkeypatch.setattr(accept_gate, "limit", lambda: 2)
    loops: list[GatedLoop] = []

    def make() -> GatedLoop:
        loops.append(GatedLoop())
        return loops[-1]

    yield make
    for transport in TRANSPORTS:
        transport.close()
    TRANSPORTS.clear()
    for loop in loops:
        loop.run_until_complete(asyncio.sleep(0))  # the transports' closing callbacks
        if not loop.is_closed():
            loop.close()


def serve(loop: GatedLoop, sock: socket.socket, made: list, begins: bool = False):
    return loop.run_until_complete(loop.create_server(lambda: Recorder(made, begins), sock=sock))


def test_a_process_takes_connections_one_at_a_time_until_its_threads_are_taken(gated, listening, clients):
    loop, made = gated(), []
    server = serve(loop, listening, made, begins=True)
    clients(listening, 5)
    spin(loop, lambda: len(made) == 2)
    settle(loop)
    # Two requests begun (the limit): the other three wait in the port's queue, not in this process.
    assert len(made) == 2 and loop.busy == 2 and queued(listening) == 3
    loop.request_ended()  # a thread is free: one more is taken, and the process is full again
    spin(loop, lambda: len(made) == 3)
    settle(loop)
    assert len(made) == 3 and queued(listening) == 2
    server.close()


def test_a_full_process_leaves_new_connections_to_one_with_room(gated, listening, clients):
    full, free = gated(), gated()
    on_full, on_free = [], []
    serve(full, listening, on_full)
    serve(free, listening, on_free)
    full.request_began(), full.request_began()  # its threads are taken
    stop = threading.Event()

    def run_full() -> None:  # the full process's loop turns all along, on its own thread
        asyncio.set_event_loop(full)
        while not stop.is_set():
            full.run_until_complete(asyncio.sleep(0.005))

    thread = threading.Thread(target=run_full)
    thread.start()
    try:
        clients(listening, 6)
        spin(free, lambda: len(on_free) == 6)
    finally:
        stop.set()
        thread.join(30)
    assert on_full == [] and queued(listening) == 0


def test_a_connection_taken_counts_until_a_request_or_websocket_begins_on_it(gated, listening, clients,
                                                                             monkeypatch):
    monkeypatch.setattr(accept_gate, "UNANSWERED_S", 600.0)  # longer than the test: only an answer frees its room
    loop, made = gated(), []
    serve(loop, listening, made)
    loop.request_began(), loop.request_began()
    clients(listening, 3)
    settle(loop)
    assert made == [] and queued(listening) == 3
    loop.request_ended()  # room for one: taken, it counts while nothing of it began
    spin(loop, lambda: len(made) == 1)
    settle(loop)
    assert loop.busy == 2 and queued(listening) == 2
    loop.answered()  # a WebSocket began on it (a request would count on its own)
    spin(loop, lambda: len(made) == 2)
    settle(loop)
    assert loop.busy == 2 and queued(listening) == 1


def test_a_connection_that_sends_nothing_counts_for_a_moment_only(gated, listening, clients, monkeypatch):
    monkeypatch.setattr(accept_gate, "UNANSWERED_S", 0.5)
    loop, made = gated(), []
    serve(loop, listening, made)
    loop.request_began()  # one request in hand, room for one more
    clients(listening, 2)
    spin(loop, lambda: len(made) == 1)
    settle(loop)
    assert loop.busy == 2 and queued(listening) == 1
    spin(loop, lambda: len(made) == 2)  # the first sends nothing: after UNANSWERED_S it no longer counts
    assert queued(listening) == 0


def test_an_accept_error_is_logged_and_tried_again(gated, listening, clients, monkeypatch, caplog):
    monkeypatch.setattr(accept_gate, "RETRY_AFTER_ERROR_S", 0.01)

    class OutOfFiles(socket.socket):
        failures = 1

        def accept(self):
            if OutOfFiles.failures:
                OutOfFiles.failures -= 1
                raise OSError(24, "Too many open files")
            return super().accept()

    sock = OutOfFiles(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    loop, made = gated(), []
    try:
        serve(loop, sock, made)
        clients(sock, 1)
        spin(loop, lambda: len(made) == 1)
    finally:
        sock.close()
    assert "accepting a connection failed (" in caplog.text and "Too many open files" in caplog.text


def test_closing_the_server_stops_taking_connections(gated, listening, clients):
    loop, made = gated(), []
    server = serve(loop, listening, made)
    server.close()
    loop.run_until_complete(server.wait_closed())
    settle(loop)
    assert listening.fileno() == -1  # closed by the server, as asyncio's own
    loop.request_began(), loop.request_began(), loop.request_ended()  # reopening a closed gate does nothing
    settle(loop)
    assert made == []


def test_a_server_that_binds_its_own_socket_is_asyncios(gated, clients):
    loop, made = gated(), []
    loop.request_began(), loop.request_began()  # full: a gated socket would take nothing
    server = loop.run_until_complete(loop.create_server(lambda: Recorder(made), host="127.0.0.1", port=0))
    sock = server.sockets[0]
    for _ in range(2):
        clients(sock, 1)
    spin(loop, lambda: len(made) == 2)
    server.close()


def test_the_gated_loop_is_libuvs():
    """The web processes run uvloop's loop (requirements.txt pins it; uvicorn picks it by itself for `make run`)."""
    import uvloop

    from jobsite.accept_gate import GatedLoop

    assert issubclass(GatedLoop, uvloop.Loop)
