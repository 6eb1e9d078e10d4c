"""The site's ASGI handler (``jobsite.asgi_handler``) runs a request's synchronous work (``request_started``, the
middleware, the view and, for a response in hand, ``request_finished``) in one thread of a pool kept for the
process, called once from the event loop: no hand-over back to the loop in the middle of a request (Django's own
handler made one for its async-capable middleware, and another to call the view) and no thread started per request
(Django's started one, and a database connection with it); every middleware still does its part, a streamed
response is closed once sent, and one whose client went away stops."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import AsyncToSync
from asgiref.testing import ApplicationCommunicator
from django.core import signals
from django.db import connection
from django.http import HttpResponse, StreamingHttpResponse
from django.urls import path

pytestmark = pytest.mark.django_db(transaction=True)


def scope_of(url: str, cookie: str = "", *headers: tuple[bytes, bytes]) -> dict:
    return {"type": "http", "http_version": "1.1", "method": "GET", "scheme": "http", "path": url,
            "raw_path": url.encode(), "query_string": b"group=phusers", "root_path": "",
            "headers": [(b"host", b"testserver"), (b"cookie", f"sessionid={cookie}".encode()), *headers],
            "client": ("127.0.0.1", 50000), "server": ("testserver", 80)}


def get(url: str, cookie: str = "", *headers: tuple[bytes, bytes]) -> tuple[int, dict[bytes, bytes], bytes]:
    from jobsite.asgi import application

    scope = scope_of(url, cookie, *headers)

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


# --- threads, and streamed responses (views of this module's own, as ROOT_URLCONF) ------------------------------

seen: list[tuple[str, object]] = []  # (what, the thread it ran in; or what a request saw counted)


def _here(what: str) -> None:
    seen.append((what, threading.current_thread().name))


def plain(request):
    _here("view")
    return HttpResponse(b"plain")


def streamed(request):
    async def body():
        for part in (b"one,", b"two,", b"three"):
            seen.append((f"sent {part.decode()}", ""))
            yield part
    return StreamingHttpResponse(body())


def endless(request):
    async def body():
        while True:
            yield b"x" * 1024
            await asyncio.sleep(0)
    return StreamingHttpResponse(body())


def counted(request):
    loop = GATED[0]
    seen.append(("in hand", (loop.requests, loop.busy)))
    return HttpResponse(b"counted")


GATED: list = []  # the web process's loop a test runs the app on

urlpatterns = [path("plain/", plain), path("streamed/", streamed), path("endless/", endless),
               path("counted/", counted)]


@pytest.fixture
def own_views(settings):
    settings.ROOT_URLCONF = __name__
    seen.clear()
    started = lambda **kw: _here("started")  # noqa: E731
    finished = lambda **kw: _here("finished")  # noqa: E731
    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    yield seen
    signals.request_started.disconnect(started)
    signals.request_finished.disconnect(finished)


def test_a_request_is_one_hop_to_a_kept_thread(own_views, settings):
    requests = 3 * settings.JOBSITE_WEB_THREADS
    for _ in range(requests):
        assert get("/plain/")[::2] == (200, b"plain")
    assert [what for what, _ in own_views] == ["started", "view", "finished"] * requests
    each = [{thread for _, thread in own_views[i:i + 3]} for i in range(0, len(own_views), 3)]
    assert all(len(threads) == 1 for threads in each)  # a request's signals and view: one thread
    threads = set().union(*each)  # the pool's: Django's handler started a thread for each request
    assert len(threads) <= settings.JOBSITE_WEB_THREADS and all(t.startswith("jobsite-web") for t in threads)


def test_a_streamed_response_is_closed_once_sent(own_views):
    assert get("/streamed/")[::2] == (200, b"one,two,three")
    assert [what for what, _ in own_views] == ["started", "sent one,", "sent two,", "sent three", "finished"]
    assert own_views[-1][1].startswith("jobsite-web")


def test_a_client_that_goes_away_stops_a_streamed_response_which_is_closed(own_views):
    from jobsite.asgi import application

    async def run():
        app = ApplicationCommunicator(application, scope_of("/endless/"))
        await app.send_input({"type": "http.request", "body": b""})
        assert (await app.receive_output(60))["status"] == 200
        assert (await app.receive_output(60))["more_body"]
        await app.send_input({"type": "http.disconnect"})
        await app.wait(60)  # ends: the response stopped
    asyncio.run(run())
    assert [what for what, _ in own_views] == ["started", "finished"]


def test_a_request_counts_in_its_process_from_its_body_to_the_end_of_its_thread_work(own_views):
    """What the web process's loop (``jobsite.accept_gate``) weighs before it takes another connection."""
    from jobsite.accept_gate import GatedLoop
    from jobsite.asgi import application

    loop = GatedLoop()
    GATED[:] = [loop]

    async def request(first: dict) -> dict | None:
        app = ApplicationCommunicator(application, scope_of("/counted/"))
        await app.send_input(first)
        start = await app.receive_output(60) if first["type"] == "http.request" else None
        await app.wait(60)
        return start

    try:
        loop.taken()  # the connection the request comes on, taken by the loop: counts until the request begins
        assert loop.busy == 1
        assert loop.run_until_complete(request({"type": "http.request", "body": b""}))["status"] == 200
        # In the view: the request counted, its connection answered; after it, nothing counts.
        assert own_views[1] == ("in hand", (1, 1)) and (loop.requests, loop.busy) == (0, 0)
        # A client that goes away before its body: counted while it was read, not after.
        assert loop.run_until_complete(request({"type": "http.disconnect"})) is None
        assert (loop.requests, loop.busy) == (0, 0)
    finally:
        loop.close()
