"""Request bodies over JOBSITE_MAX_BODY_BYTES are refused at the ASGI edge (jobsite.limits), under a real server."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading

import pytest
import uvicorn

from jobsite.limits import BodySizeLimit

LIMIT = 64 * 1024


class EchoApp:
    """Answers the size of the body it read; remembers every call."""

    def __init__(self):
        self.calls: list[str] = []

    async def __call__(self, scope, receive, send):
        self.calls.append(scope["type"])
        size = 0
        while True:
            message = await receive()
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = json.dumps({"size": size}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def server():
    """uvicorn serving BodySizeLimit(EchoApp) on a socket bound here: connections queue until it accepts them."""
    app = EchoApp()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    instance = uvicorn.Server(uvicorn.Config(BodySizeLimit(app, max_bytes=LIMIT), lifespan="off", log_level="warning"))
    thread = threading.Thread(target=instance.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield sock.getsockname(), app
    instance.should_exit = True
    thread.join(timeout=10)
    sock.close()


def read_response(conn: socket.socket) -> tuple[int, bytes]:
    """Status and body of the one response on ``conn`` (every response here has a Content-Length)."""
    data = b""
    while True:
        try:
            chunk = conn.recv(65536)
        except ConnectionResetError:
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if not chunk or (sep and len(body) >= _content_length(head)):
            break
    return int(data.split(b" ", 2)[1]), data.partition(b"\r\n\r\n")[2]


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 62


def test_content_length_over_the_limit_is_413_before_any_body_is_sent(server):
    address, app = server
    with socket.create_connection(address, timeout=10) as conn:
        conn.sendall(b"POST /api/v1/jobs/ HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000000000000000\r\n\r\n")
        status, body = read_response(conn)
    assert status == 413
    assert "JOBSITE_MAX_BODY_BYTES" in json.loads(body)["detail"]
    assert app.calls == []


def test_a_chunked_body_is_cut_off_past_the_limit_and_never_read_whole(server):
    address, app = server
    chunk = b"x" * 8192
    total = 64 << 20
    sent = 0
    with socket.create_connection(address, timeout=10) as conn:
        conn.sendall(b"POST /api/v1/jobs/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            while sent < total and not select.select([conn], [], [], 0)[0]:
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        status, _ = read_response(conn)
    assert status == 413
    assert sent < total // 4  # refused long before the client was done
    assert app.calls == []


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_within_the_limit_reaches_the_app_whole(server, chunked):
    address, app = server
    payload = b"y" * LIMIT
    with socket.create_connection(address, timeout=10) as conn:
        if chunked:
            conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            for start in range(0, len(payload), 10000):
                part = payload[start:start + 10000]
                conn.sendall(b"%x\r\n%s\r\n" % (len(part), part))
            conn.sendall(b"0\r\n\r\n")
        else:
            conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % LIMIT
                         + payload)
        status, body = read_response(conn)
    assert status == 200
    assert json.loads(body) == {"size": LIMIT}


def test_websockets_and_lifespan_pass_through_untouched():
    app = EchoApp()
    seen = []

    async def inner(scope, receive, send):
        seen.append((scope["type"], await receive()))

    async def receive():
        return {"type": "websocket.connect"}

    asyncio.run(BodySizeLimit(inner, max_bytes=1)({"type": "websocket", "headers": []}, receive, None))
    assert seen == [("websocket", {"type": "websocket.connect"})]
    assert app.calls == []


def test_the_jobsite_application_refuses_a_large_body_without_reading_it(settings):
    from jobsite.asgi import application

    sent = []

    async def receive():
        raise AssertionError("the body must not be read")

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/api/v1/jobs/", "headers": [
        (b"host", b"127.0.0.1"), (b"content-length", str(settings.JOBSITE_MAX_BODY_BYTES + 1).encode())]}
    asyncio.run(application(scope, receive, send))
    assert sent[0]["status"] == 413
