"""``/jobs/<id>/ports/<port>/...`` on the port's own host (``j<id>-p<port>.<JOBSITE_PORTS_DOMAIN>``,
``jobs.port_origin``): HTTP and WebSocket traffic to a port a running job declares (``Job.ports``), on replica 0 (or
``?rank=N``), through its supervisor (the job's network is closed to the machine: ``exec_door``).

``PortHost`` serves that path only, for that host's job and port (anything else there is 404: the site is not served
on a port's host), to the holder of the host's own cookie (``port_origin``), who must still see the job, Running, at
each request and WebSocket. The app in the job sees the whole path, prefix included (``JOB_BASE_URL``: serve under it,
as Jupyter's ``--ServerApp.base_url`` does), and none of the site's cookies, the port's cookie, nor an Authorization
header.
"""
from __future__ import annotations

import asyncio
import contextlib
import re
import time
from urllib.parse import parse_qs, quote

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from . import exec_door, port_origin
from .services import sessions

PATH = re.compile(r"^/jobs/(?P<pk>\d+)/ports/(?P<port>\d+)(?P<rest>/.*)?$")
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer",
              b"upgrade", b"host", b"authorization", b"proxy-authorization"}


def _site_cookies() -> set[str]:
    return {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME, port_origin.PORT_COOKIE}


def _cookie_header(value: bytes) -> bytes:
    """The Cookie header without the site's own cookies nor the port's (the job never sees the user's logins)."""
    own = _site_cookies()
    kept = [c for c in value.decode("latin-1").split(";") if c.strip().split("=", 1)[0] not in own]
    return ";".join(kept).strip().encode("latin-1")


def _names_site_cookie(set_cookie: bytes) -> bool:
    """Whether a Set-Cookie of the job's app would set one of the site's or the port's cookies (dropped)."""
    return set_cookie.decode("latin-1").split("=", 1)[0].strip() in _site_cookies()


# Answer headers a job's app may not send through the site: a service worker scoped beyond the job's port (it would
# answer for the site's own pages) and clearing the site's cookies and storage in the visitor's browser.
SITE_WIDE = {b"service-worker-allowed", b"clear-site-data"}


def kept_answer_header(name: bytes, value: bytes) -> bool:
    """Whether a header of the job's answer (``name`` lower case) is passed on to the browser."""
    if name in HOP_BY_HOP or name in SITE_WIDE:
        return False
    return not (name == b"set-cookie" and _names_site_cookie(value))


def _rank(scope) -> int:
    try:
        return int(parse_qs(scope.get("query_string", b"").decode()).get("rank", ["0"])[-1])
    except ValueError:
        return -1


async def _open(scope, pk: int, port: int):
    """(target, connected socket) of the port, or SessionRefused / DoorClosed."""
    target = await database_sync_to_async(sessions.port_target)(user=scope["user"], job_id=pk, port=port,
                                                                rank=_rank(scope))
    from . import gateway_door

    if gateway_door.applies(target):  # a Kubernetes pod: through the gateway, which port-forwards to it
        return target, await sync_to_async(gateway_door.connect_port, thread_sensitive=False)(target, port)
    path = exec_door.socket_path(root=target.backend_root, job_id=pk, attempt_number=target.attempt.number,
                                 rank=target.rank)
    sock = await sync_to_async(exec_door.connect_port, thread_sensitive=False)(path, port)
    return target, sock


class PortProxy:
    """The HTTP side (an ASGI app, behind ``PortHost``, which puts the port cookie's user in the scope)."""

    async def __call__(self, scope, receive, send) -> None:
        match = PATH.match(scope["path"])
        pk, port = int(match["pk"]), int(match["port"])
        user = scope.get("user")
        if user is None or not user.is_authenticated:
            return await _reply(send, 403, b"Not signed in to this port.")
        try:
            _target, sock = await _open(scope, pk, port)
        except sessions.SessionRefused as refused:
            return await _reply(send, refused.status, refused.message.encode())
        except exec_door.DoorClosed as exc:
            return await _reply(send, 502, str(exc).encode())
        reader, writer = await asyncio.open_connection(sock=sock)
        try:
            await self._forward(scope, receive, send, reader, writer, port)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _forward(self, scope, receive, send, reader, writer, port: int) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        target = quote(scope["path"]) + (f"?{scope['query_string'].decode()}" if scope.get("query_string") else "")
        lines = [f"{scope['method']} {target} HTTP/1.0".encode(), f"Host: 127.0.0.1:{port}".encode()]
        for name, value in scope.get("headers", []):
            if name in HOP_BY_HOP or name == b"content-length":
                continue
            if name == b"cookie" and not (value := _cookie_header(value)):
                continue
            if name == b"origin" and port_origin.same_origin(scope):  # the app's own page: as the app sees itself
                value = f"http://127.0.0.1:{port}".encode()
            lines.append(name + b": " + value)
        lines += [f"Content-Length: {len(body)}".encode(), b"Connection: close",
                  f"X-Forwarded-Prefix: /jobs/{PATH.match(scope['path'])['pk']}/ports/{port}".encode()]
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        await writer.drain()
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            return await _reply(send, 502, b"The job's port closed the connection without an answer.")
        status_line, *header_lines = head[:-4].split(b"\r\n")
        try:
            status = int(status_line.split()[1])
        except (IndexError, ValueError):
            return await _reply(send, 502, b"The job's port did not answer HTTP.")
        headers = []
        for line in header_lines:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if kept_answer_header(name, value):
                headers.append((name, value.strip()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        while chunk := await reader.read(65536):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def _reply(send, status: int, body: bytes, headers: list | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class _PortSession(AsyncWebsocketConsumer):
    """What a session to a job's port does when it opens (counted, its relay from the job started) and ends (the relay
    stopped, the session recorded as an event with its length)."""

    def _opened(self) -> None:
        self.started = time.monotonic()
        sessions.SESSIONS.labels("port").inc()
        sessions.OPEN_SESSIONS.labels("port").inc()
        self.pump = asyncio.create_task(self._from_job())

    def _stop_pump(self) -> None:
        if self.pump is not None and self.pump is not asyncio.current_task():
            self.pump.cancel()

    async def _closed(self, what: str) -> None:
        await database_sync_to_async(sessions.port_session_record)(
            target=self.target, user=self.scope["user"], port=self.port, what=what,
            seconds=time.monotonic() - self.started)


class PortSocketConsumer(_PortSession):
    """The WebSocket side: each frame relayed to and from a WebSocket of the job's port, as it is (text or binary).
    Refusals: close codes 4404, 4409, 4502 (nothing answers on the port)."""

    async def connect(self) -> None:
        from websockets.asyncio.client import connect

        self.upstream = None
        self.pump: asyncio.Task | None = None
        match = PATH.match(self.scope["path"])
        pk, self.port = int(match["pk"]), int(match["port"])
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return await self.close(code=4404)
        try:
            self.target, sock = await _open(self.scope, pk, self.port)
        except sessions.SessionRefused as refused:
            return await self.close(code=4000 + refused.status)
        except exec_door.DoorClosed:
            return await self.close(code=4502)
        query = self.scope.get("query_string", b"").decode()
        uri = f"ws://127.0.0.1:{self.port}{quote(self.scope['path'])}" + (f"?{query}" if query else "")
        headers = [(n.decode("latin-1"), _cookie_header(v).decode("latin-1"))
                   for n, v in self.scope.get("headers", []) if n == b"cookie" and _cookie_header(v)]
        try:
            self.upstream = await connect(uri, sock=sock, subprotocols=self.scope.get("subprotocols") or None,
                                          additional_headers=headers, max_size=None, open_timeout=30)
        except Exception:  # noqa: BLE001 - whatever the app in the job answered, it was not a WebSocket
            sock.close()
            return await self.close(code=4502)
        await self.accept(subprotocol=self.upstream.subprotocol)
        self._opened()

    async def _from_job(self) -> None:
        with contextlib.suppress(Exception):
            async for message in self.upstream:
                if isinstance(message, bytes):
                    await self.send(bytes_data=message)
                else:
                    await self.send(text_data=message)
        await self.close()

    async def receive(self, text_data=None, bytes_data=None) -> None:
        if self.upstream is not None:
            with contextlib.suppress(Exception):
                await self.upstream.send(bytes_data if bytes_data is not None else text_data)

    async def disconnect(self, code: int) -> None:
        upstream, self.upstream = getattr(self, "upstream", None), None
        if upstream is None:
            return
        self._stop_pump()
        with contextlib.suppress(Exception):
            await upstream.close()
        await self._closed("a WebSocket")


class PortForwardConsumer(_PortSession):
    """``ws/jobs/<id>/portforward/?port=P&rank=N`` (jobctl port-forward): one TCP connection to a declared port, its
    bytes both ways as binary frames. The user comes from the session or jobctl's token, as for exec."""

    async def connect(self) -> None:
        from .exec_consumers import token_user

        self.writer = None
        self.pump: asyncio.Task | None = None
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            self.scope["user"] = user = await database_sync_to_async(token_user)(self.scope)
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            self.port = int(query.get("port", ["0"])[-1])
            self.target, sock = await _open(self.scope, int(self.scope["url_route"]["kwargs"]["pk"]), self.port)
        except ValueError:
            return await self.close(code=4400)
        except sessions.SessionRefused as refused:
            return await self.close(code=4000 + refused.status)
        except exec_door.DoorClosed:
            return await self.close(code=4502)
        self.reader, self.writer = await asyncio.open_connection(sock=sock)
        await self.accept()
        self._opened()

    async def _from_job(self) -> None:
        with contextlib.suppress(Exception):
            while chunk := await self.reader.read(65536):
                await self.send(bytes_data=chunk)
        await self.close()

    async def receive(self, text_data=None, bytes_data=None) -> None:
        if self.writer is not None and bytes_data:
            self.writer.write(bytes_data)
            with contextlib.suppress(Exception):
                await self.writer.drain()

    async def disconnect(self, code: int) -> None:
        writer, self.writer = getattr(self, "writer", None), None
        if writer is None:
            return
        self._stop_pump()
        writer.close()
        await self._closed("a port-forward")


class PortHost:
    """All that comes to a port's own host (``jobsite.asgi`` routes it here by its Host header): that port's path
    only, for the holder of the host's cookie; its sign-in step (a ticket from the site, traded for the cookie); 404
    for any other path (the site's pages, API, WebSockets are not served here). A WebSocket must come from a page of
    this same host (its Origin)."""

    def __init__(self):
        self.proxy = PortProxy()
        self.socket = PortSocketConsumer.as_asgi()

    async def __call__(self, scope, receive, send) -> None:
        pk, port = port_origin.port_of_scope(scope)
        match = PATH.match(scope["path"])
        if match is None or (match["pk"], match["port"]) != (str(pk), str(port)):
            return await _refuse(scope, receive, send, 404, f"Not found: this host serves port {port} of job {pk}, "
                                                            f"under /jobs/{pk}/ports/{port}/, and nothing else.")
        websocket = scope["type"] == "websocket"
        if websocket and not port_origin.same_origin(scope):
            return await _refuse(scope, receive, send, 403, "A WebSocket from another origin.")
        if not websocket and match["rest"] == port_origin.AUTH_STEP:
            return await self._sign_in(scope, send, pk, port)
        user = await database_sync_to_async(port_origin.cookie_user)(scope, pk, port)
        if user is None:
            if websocket or scope["method"] not in ("GET", "HEAD"):
                return await _refuse(scope, receive, send, 401, "Not signed in: open the port from the job's page.")
            query = f"?{scope['query_string'].decode('latin-1')}" if scope.get("query_string") else ""
            again = settings.JOBSITE_BASE_URL.rstrip("/") + quote(scope["path"]) + query  # the site signs in again
            return await _reply(send, 302, b"", [(b"location", again.encode("latin-1")),
                                                 (b"cache-control", b"no-store")])
        scope = {**scope, "user": user}
        return await (self.socket if websocket else self.proxy)(scope, receive, send)

    async def _sign_in(self, scope, send, pk: int, port: int) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        ticket, following = query.get("ticket", [""])[-1], query.get("next", ["/"])[-1]
        user = await database_sync_to_async(port_origin.ticket_user)(ticket, pk, port)
        if user is None:
            return await _reply(send, 403, b"This link to the port is used, expired or not genuine: open the port "
                                           b"again from the job's page.")
        secure = scope.get("scheme") == "https" or settings.JOBSITE_HTTPS
        location = quote(f"/jobs/{pk}/ports/{port}" + (following if following.startswith("/") else "/"),
                         safe="/%?&=:@!$'()*+,;")  # a path of this host: no other host, no header break
        await _reply(send, 302, b"", [(b"location", location.encode()), (b"cache-control", b"no-store"),
                                      (b"set-cookie", port_origin.cookie_header(user, pk, port, secure=secure))])


async def _refuse(scope, receive, send, status: int, text: str) -> None:
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        return await send({"type": "websocket.close", "code": 4000 + status})
    await _reply(send, status, text.encode())
