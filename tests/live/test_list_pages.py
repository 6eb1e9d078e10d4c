"""The job list's shared pages (``jobs.live_list``): sockets of one process whose pages are alike get one frame,
made once and encoded once, written as the same bytes to each; a socket that does not keep up leaves its page and
catches up from the hub's ring."""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace

import pytest
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from jobs import live_hub, live_list
from jobs.live_list import JobsConsumer, ListPage, share, text_frame
from tests.waiting import async_wait_for, wait_for

from .conftest import db, pending


def counting_list_frames(monkeypatch) -> list[int]:
    calls: list[int] = []
    made = live_list.list_frames

    def counted(*args, **kwargs):
        calls.append(1)
        return made(*args, **kwargs)

    monkeypatch.setattr(live_list, "list_frames", counted)
    return calls


def the_pages() -> list[ListPage]:
    return [page for hub in list(live_hub._hubs.values()) for page in hub.pages.values()]


@pytest.mark.fast
@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536])
def test_a_text_frame_is_encoded_as_a_server_sends_it(size):
    text = "é" * (size // 2) + "x" * (size % 2)
    assert text_frame(text) == Frame(Opcode.TEXT, text.encode()).serialize(mask=False, extensions=[])


class FakeConnection:
    """What ``page_frames`` writes to: uvicorn's protocol (open, writable) and its transport."""

    def __init__(self):
        self.written: list[bytes] = []
        self.conn = SimpleNamespace(state=State.OPEN)
        self.close_sent = self.disconnected = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.transport = SimpleNamespace(write=self.written.append, is_closing=lambda: False)


def list_socket(hub, shown: set[int], connection=None, sent=None) -> JobsConsumer:
    consumer = JobsConsumer()
    consumer.hub, consumer.joined, consumer.params, consumer.page, consumer.page_size = hub, {"g"}, "", 1, 50
    consumer.first_page_url, consumer.filtered, consumer.shown, consumer.new_count = "/", False, set(shown), 0
    consumer.client_shown, consumer.outbox, consumer.outgoing, consumer.list_page = set(shown), deque(), None, None
    consumer.buffer, consumer.sending, consumer.behind_since = {}, None, None
    consumer.caught_up = asyncio.Event()
    consumer.caught_up.set()
    consumer.connection = connection
    consumer.caught_up_since = []
    consumer.hub_catch_up = consumer.caught_up_since.append  # what falling behind asks for

    async def send(text_data=None, **kwargs):
        if sent is None:
            await asyncio.Event().wait()  # a connection that takes nothing
        sent.append(text_data)

    consumer.send = send
    return consumer


def fake_hub():
    return SimpleNamespace(pages={}, quiet=lambda consumer, quiet: None)


def row(job_id: int, status: str, at: float = 1.0) -> dict:
    return {"id": job_id, "at": at, "row": f'<tr id="job-{job_id}"><td>{status}</td></tr>'}


@pytest.mark.fast
@pytest.mark.asyncio
async def test_alike_sockets_share_one_page_and_are_written_the_same_bytes(monkeypatch):
    calls = counting_list_frames(monkeypatch)
    hub = fake_hub()
    first, second = FakeConnection(), FakeConnection()
    sockets = [list_socket(hub, {1, 2}, first), list_socket(hub, {1, 2}, second)]
    for consumer in sockets:
        share(hub, consumer)
    (page,) = hub.pages.values()
    assert page.members == set(sockets)
    live_list.flush_pages(hub, {"g": {2: row(2, "Running"), 3: row(3, "Pending")}})
    assert len(calls) == 1  # made once for both
    assert first.written == second.written and first.written[0] is second.written[0]  # encoded once
    frames = first.written[0]
    assert frames.startswith(text_frame('<tr id="job-2" hx-swap-oob="true"><td>Running</td></tr>'))
    assert b"afterbegin:#job-rows" in frames and page.shown == {1, 2, 3}
    # A socket that opens now with that page joins it.
    third = list_socket(hub, {1, 2, 3}, FakeConnection())
    share(hub, third)
    assert list(hub.pages.values()) == [page] and third in page.members


@pytest.mark.fast
@pytest.mark.asyncio
async def test_pages_made_alike_by_a_flush_merge(monkeypatch):
    hub = fake_hub()
    showing, not_showing = list_socket(hub, {1, 2}, FakeConnection()), list_socket(hub, {1}, FakeConnection())
    share(hub, showing)
    share(hub, not_showing)
    assert len(hub.pages) == 2
    live_list.flush_pages(hub, {"g": {2: row(2, "Running")}})
    (page,) = hub.pages.values()
    assert page.members == {showing, not_showing} and showing.list_page is not_showing.list_page is page
    assert b"afterbegin:#job-rows" in not_showing.connection.written[0]  # inserted …
    assert b'<tr id="job-2" hx-swap-oob="true">' in showing.connection.written[0]  # … replaced


@pytest.mark.fast
@pytest.mark.asyncio
async def test_a_socket_without_a_fast_connection_is_sent_its_frames_in_order():
    hub, sent = fake_hub(), []
    consumer = list_socket(hub, {1}, None, sent)
    share(hub, consumer)
    page = consumer.list_page
    page.advance({1: row(1, "Running")}, None)
    page.advance({1: row(1, "Failed")}, None)
    await async_wait_for(lambda: len(sent) == 2)
    assert "Running" in sent[0] and "Failed" in sent[1]


@pytest.mark.fast
@pytest.mark.asyncio
async def test_a_socket_that_does_not_keep_up_leaves_its_page_and_catches_up_from_when_it_fell_behind():
    hub = fake_hub()
    slow, fast = list_socket(hub, {1}), list_socket(hub, {1}, FakeConnection())
    share(hub, slow)
    share(hub, fast)
    page = slow.list_page
    page.advance({1: row(1, "Running")}, None)  # being sent, never done
    await asyncio.sleep(0)
    page.advance({2: row(2, "Pending")}, None)  # the first it will not be sent: the page showed {1} before it
    behind = slow.outbox[-1]
    for n in range(live_list.OUTBOX_MAX):
        page.advance({1: row(1, f"state {n}")}, None)
    assert slow.list_page is None and slow not in page.members and len(slow.outbox) == 1
    assert slow.shown == {1} and slow.client_shown == {1}
    (since,) = slow.caught_up_since
    assert abs(since.timestamp() - (behind.at - live_list.catchup.MARGIN.total_seconds())) < 1e-3
    assert len(fast.connection.written) == live_list.OUTBOX_MAX + 2  # the others are not held back
    slow.outgoing.cancel()


@pytest.mark.fast
@pytest.mark.asyncio
async def test_a_connection_whose_send_buffer_is_full_is_sent_the_newest_rows_once_it_takes_more():
    hub = fake_hub()
    full = FakeConnection()
    slow, fast = list_socket(hub, {1}, full), list_socket(hub, {1}, FakeConnection())
    share(hub, slow)
    share(hub, fast)
    full.writable.clear()
    live_list.flush_pages(hub, {"g": {2: row(2, "Pending", at=5.0)}})
    assert not full.written and slow.list_page is None and not slow.outbox  # nothing queued for it
    assert slow.shown == {1}  # as it was before the frame it was not sent
    (since,) = slow.caught_up_since
    (page,) = hub.pages.values()
    assert page.members == {fast} and len(fast.connection.written) == 1


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_two_sockets_of_one_list_receive_byte_identical_frames_made_once(ws, world, submit, monkeypatch):
    job = await db(submit, "bob", name="watched")
    calls = counting_list_frames(monkeypatch)
    first, _ = await ws("/ws/jobs/", world.users["bob"])
    second, _ = await ws("/ws/jobs/", world.users["bob"])
    await async_wait_for(lambda: any(len(page.members) == 2 for page in the_pages()), message="one shared page")
    calls.clear()
    await db(pending, job)
    frames = [await first.receive_from(timeout=10), await second.receive_from(timeout=10)]
    assert frames[0] == frames[1] and f'id="job-{job.pk}"' in frames[0] and ">Pending</span>" in frames[0]
    assert len(calls) == 1


@pytest.mark.django_db(transaction=True)
def test_under_uvicorn_the_frames_are_written_to_the_connections_as_bytes(asgi_server, world, submit):
    """The production path: uvicorn's connections take the page's bytes; each client reads a valid text frame."""
    from websockets.sync.client import connect

    from .conftest import session_cookie

    job = submit("bob", name="watched")
    cookie = session_cookie(world.users["bob"]).decode()
    url = asgi_server.replace("http", "ws") + "/ws/jobs/"
    with connect(url, origin=asgi_server, additional_headers={"Cookie": cookie}) as first, \
            connect(url, origin=asgi_server, additional_headers={"Cookie": cookie}) as second:
        pages = wait_for(lambda: [p for p in the_pages() if len(p.members) == 2], message="one shared page")
        assert all(member.connection is not None for member in pages[0].members)  # written as bytes
        pending(job)
        received = [first.recv(timeout=30), second.recv(timeout=30)]
        assert received[0] == received[1] and ">Pending</span>" in received[0]


@pytest.mark.fast
@pytest.mark.asyncio
async def test_alike_catch_up_reads_under_way_are_read_once():
    import threading

    from channels.layers import InMemoryChannelLayer

    hub = live_hub.Hub(InMemoryChannelLayer())
    calls, go = [], threading.Event()

    def read(page: int) -> str:
        calls.append(page)
        assert go.wait(30)
        return f"page {page}"

    first = asyncio.ensure_future(hub.read_once(read, 1))
    second = asyncio.ensure_future(hub.read_once(read, 1))
    other = asyncio.ensure_future(hub.read_once(read, 2))
    await async_wait_for(lambda: len(calls) == 1)
    go.set()
    assert await asyncio.gather(first, second, other) == ["page 1", "page 1", "page 2"]
    assert calls == [1, 2] and not hub.reads
