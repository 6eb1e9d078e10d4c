"""Request bodies larger than JOBSITE_MAX_BODY_BYTES are refused at the ASGI edge, before Django reads them.

Django's ASGI handler reads a whole request body (into a temporary file past 2.5 MB) before any view or middleware
can look at it, so a huge anonymous upload would be stored before its 401. This middleware answers 413 at once
when Content-Length is over the limit, and stops reading a chunked body as soon as it passes the limit; either way
the rest is never read and the connection is closed. Bodies within the limit (a few MiB at most) are read here and
handed on unchanged. WebSockets and lifespan pass through untouched. The API has a smaller limit of its own,
JOBSITE_API_MAX_BODY_BYTES (``jobs.api.body_limit``), checked by each API view.
"""

from __future__ import annotations

import json

DEFAULT_MAX_BODY_BYTES = 4 << 20


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send, max_bytes: int) -> None:
    body = json.dumps({
        "detail": f"The request body is larger than {max_bytes} bytes (JOBSITE_MAX_BODY_BYTES).", "errors": {},
    }).encode()
    await send({
        "type": "http.response.start",
        "status": 413,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close")],
    })
    await send({"type": "http.response.body", "body": body})


class BodySizeLimit:
    """ASGI middleware: 413 for HTTP request bodies over ``max_bytes`` (default: settings.JOBSITE_MAX_BODY_BYTES)."""

    def __init__(self, app, max_bytes: int | None = None):
        self.app = app
        self._max_bytes = max_bytes

    @property
    def max_bytes(self) -> int:
        if self._max_bytes is None:
            from django.conf import settings

            self._max_bytes = getattr(settings, "JOBSITE_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES)
        return self._max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        max_bytes = self.max_bytes
        length = _content_length(scope)
        if length is not None and length > max_bytes:
            return await _refuse(send, max_bytes)

        # Read the body here, at most max_bytes of it, then replay it to the app.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: let the app see that
                return await self.app(scope, _replay([message], receive), send)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > max_bytes:
                return await _refuse(send, max_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        return await self.app(scope, _replay([body], receive), send)


def _replay(messages: list[dict], receive):
    pending = list(messages)

    async def replayed():
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
