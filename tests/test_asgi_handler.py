"""The site's ASGI handler (``jobsite.asgi_handler``) runs the middleware and the view in one thread, called once
from the event loop: no hand-over back to the loop in the middle of a request (Django's own handler made one for
its async-capable middleware, and another to call the view), and every middleware still does its part."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import AsyncToSync
from asgiref.testing import ApplicationCommunicator
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)


def get(path: str, cookie: str, *headers: tuple[bytes, bytes]) -> tuple[int, dict[bytes, bytes], bytes]:
    from jobsite.asgi import application

    scope = {"type": "http", "http_version": "1.1", "method": "GET", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"group=phusers", "root_path": "",
             "headers": [(b"host", b"testserver"), (b"cookie", f"sessionid={cookie}".encode()), *headers],
             "client": ("127.0.0.1", 50000), "server": ("testserver", 80)}

    async def run():
        app = ApplicationCommunicator(application, scope)
        await app.send_input({"type": "http.request", "body": b""})
        start = await app.receive_output(60)
        body = b""
        while True:
            message = await app.receive_output(60)
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await app.wait(60)  # to its end: the request's thread gives its database connection back to the pool
        return start["status"], dict(start["headers"]), body

    return asyncio.run(run())


def checked_out() -> int:
    """The pool's connections in use (0 without a pool)."""
    stats = connection.pool.get_stats() if connection.vendor == "postgresql" and connection.pool else {}
    return stats.get("pool_size", 0) - stats.get("pool_available", 0)


def test_a_request_goes_through_every_middleware_without_going_back_to_the_loop(world, client, monkeypatch):
    client.force_login(world.users["bob"])
    cookie = client.cookies["sessionid"].value
    hops = []
    call = AsyncToSync.__call__
    monkeypatch.setattr(AsyncToSync, "__call__", lambda self, *a, **kw: hops.append(self) or call(self, *a, **kw))

    out_before = checked_out()
    status, headers, body = get("/jobs/new/", cookie)
    assert status == 200 and b"<html" in body  # the session's user (sessions, auth) on the whole page
    assert b"Content-Security-Policy" in {k.title() for k in headers}  # the site's own last middleware
    status, headers, partial = get("/jobs/new/", cookie, (b"hx-request", b"true"))
    assert status == 200 and b"<html" not in partial and b"phusers" in partial  # htmx's: the group's fields alone
    assert hops == []  # Django's handler handed each request back to the loop (its async path for htmx's)
    assert checked_out() <= out_before  # each request's thread gave its connection back to the pool
