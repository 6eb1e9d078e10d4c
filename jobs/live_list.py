"""The live job list (``ws/jobs/``): one frame per page state, made once and written as the same bytes to every
socket that shows that state.

A socket first catches up on its own (``jobs.catchup``: the changes its process heard, or its page read again) and
takes the hub's pushes alone until it has sent them (``JobsConsumer`` is a ``consumers._CoalescingConsumer``). Then
it joins a **shared page** (``ListPage``): the sockets of one process whose pages are alike (the same audience,
filters, page number, rows shown and "N new jobs" count). At each flush of the hub (``live_hub.FLUSH_SECONDS``) a
page that has changes makes its frames once (``list_frames``: rows replaced or deleted, inserted, the notice),
encodes them once as WebSocket text frames (``OutFrames.wire``) and hands the same bytes to each member, which writes
them straight to its connection's transport (uvicorn's sans-I/O WebSocket protocol, no per-message compression):
no Python work per socket beyond that write. Elsewhere (another server, the test communicator, a connection whose
send buffer is full) the frames wait in the socket's outbox and go through the ASGI ``send`` in order; a socket more
than ``OUTBOX_MAX`` flushes behind leaves its page, drops what waits and catches up from the hub's ring of recent
changes (``Hub.recent``), then joins a page again. Pages whose state becomes the same merge.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.http import QueryDict
from django.utils.dateparse import parse_datetime
from django.utils.html import escape
from websockets.protocol import State

from . import catchup
from .consumers import LIST_PAGE_KEYS, _CoalescingConsumer, user_channel_groups, with_oob
from .live_hub import newest_items

log = logging.getLogger(__name__)

# A socket this many flushes behind (its connection not taking what it is sent) leaves its page and catches up.
OUTBOX_MAX = 40


def list_frames(page: Any, shown: set[int], new_count: int, items: dict[int, dict[str, Any]],
                matched: set[int] | None) -> tuple[list[str], int]:
    """The frames that bring a list page (``page``: ``number``, ``size``, ``first_page_url``) showing ``shown``
    (changed in place) with ``new_count`` new jobs announced up to date with ``items``, and its new count. Pure
    string work, no rendering: rows replaced or deleted, rows inserted, the notice (each "" when none)."""
    pieces: list[str] = []
    inserts: list[str] = []
    count = new_count
    for job_id in sorted(items):
        item = items[job_id]
        matches = matched is None or job_id in matched
        if job_id in shown:
            if matches:
                pieces.append(with_oob(item["row"]))
            else:
                shown.discard(job_id)
                pieces.append(f'<tr id="job-{job_id}" hx-swap-oob="delete"></tr>')
            continue
        if not matches:
            continue
        if page.number != 1 and job_id > max(shown, default=0):
            count += 1
            continue
        if shown and job_id < min(shown) and len(shown) >= page.size:
            continue  # its place is on a later page
        above = [i for i in shown if i > job_id]
        where = f"afterend:#job-{min(above)}" if above else "afterbegin:#job-rows"
        inserts.append(f'<tbody hx-swap-oob="{where}">{item["row"]}</tbody>')
        shown.add(job_id)
        if len(shown) > page.size:
            last = min(shown)
            shown.discard(last)
            pieces.append(f'<tr id="job-{last}" hx-swap-oob="delete"></tr>')
    noun = "job" if count == 1 else "jobs"
    notice = "" if count == new_count else (
        f'<p id="new-jobs" class="new-jobs" role="status" hx-swap-oob="true">'
        f'<a href="{escape(page.first_page_url)}">{count} new {noun} — show</a></p>')
    return ["".join(pieces), "".join(inserts), notice], count


def text_frame(text: str) -> bytes:
    """``text`` as one unmasked, uncompressed WebSocket text frame (RFC 6455 §5.2), as a server sends it."""
    data = text.encode()
    size = len(data)
    if size < 126:
        return bytes((0x81, size)) + data
    if size < 1 << 16:
        return bytes((0x81, 126)) + size.to_bytes(2, "big") + data
    return bytes((0x81, 127)) + size.to_bytes(8, "big") + data


@dataclass(eq=False)
class OutFrames:
    """One flush's frames of a page: the texts (for the ASGI ``send``), the same encoded once as WebSocket frames
    (``wire``), and the page's state before them with the flush's time (for a socket that falls behind)."""

    texts: list[str]
    before: tuple[frozenset[int], int]
    at: float
    wire: bytes = b""

    def __post_init__(self) -> None:
        self.texts = [text for text in self.texts if text]
        self.wire = b"".join(text_frame(text) for text in self.texts)


@dataclass(eq=False)
class ListPage:
    """The state shared by the sockets of one process whose list pages are alike."""

    groups: frozenset[str]
    params: str
    number: int
    size: int
    first_page_url: str
    filtered: bool
    shown: frozenset[int]
    new_count: int
    members: set[Any] = field(default_factory=set)
    busy: int = 0  # filtered: advances waiting for their match query

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.groups, self.params, self.number, self.shown, self.new_count)

    def advance(self, items: dict[int, dict[str, Any]], matched: set[int] | None) -> None:
        """Apply one flush's ``items``: frames made once, the same bytes to every member."""
        shown = set(self.shown)
        texts, count = list_frames(self, shown, self.new_count, items, matched)
        out = OutFrames(texts, (self.shown, self.new_count), time.time())
        self.shown, self.new_count = frozenset(shown), count
        if out.texts:
            for member in list(self.members):
                member.page_frames(out)


def _items_of(pending: dict[str, dict[int, dict[str, Any]]], groups: frozenset[str]) -> dict[int, dict[str, Any]]:
    found = [pending[name] for name in groups if name in pending]
    return found[0] if len(found) == 1 else newest_items(found)


def flush_pages(hub: Any, pending: dict[str, dict[int, dict[str, Any]]]) -> None:
    """One flush of the hub for its shared pages: each page with changes advances once; unfiltered pages now alike
    merge (they all took the same flushes); filtered ones advance once their match query (one per filters and
    changes, ``Hub.matching``) is back."""
    pages: dict[Any, ListPage] = {}
    by_groups: dict[frozenset[str], dict[int, dict[str, Any]]] = {}
    for key, page in list(hub.pages.items()):
        if page.groups not in by_groups:
            by_groups[page.groups] = _items_of(pending, page.groups)
        items = by_groups[page.groups]
        if items and page.filtered:
            page.busy += 1
            asyncio.ensure_future(_advance_filtered(hub, key, page, items))
        elif items:
            page.advance(items, None)
        if page.filtered:
            pages[key] = page
            continue
        same = pages.get(page.key)
        if same is None:
            pages[page.key] = page
        else:
            same.members |= page.members
            for member in page.members:
                member.list_page = same
    hub.pages = {key: page for key, page in pages.items() if page.members}  # members may have fallen behind


async def _advance_filtered(hub: Any, key: Any, page: ListPage, items: dict[int, dict[str, Any]]) -> None:
    try:
        matched = await hub.matching(page.params, frozenset(items))
    except Exception:
        log.exception("live updates: could not match changes against a page's filters")
        matched = set()
    finally:
        page.busy -= 1
    page.advance(items, matched)
    if hub.pages.get(key) is page:  # filed under its new state, unless another page is filed there
        del hub.pages[key]
        hub.pages[page.key if page.key not in hub.pages else (page.key, id(page))] = page


def share(hub: Any, consumer: JobsConsumer) -> None:
    """``consumer`` (caught up, nothing waiting) joins the page alike to its own, or makes one; the hub hands it no
    more pushes of its own."""
    page = ListPage(frozenset(consumer.joined), consumer.params, consumer.page, consumer.page_size,
                    consumer.first_page_url, consumer.filtered, frozenset(consumer.shown), consumer.new_count)
    same = hub.pages.get(page.key)
    if same is not None and not same.busy:
        page = same
    else:
        hub.pages[page.key if same is None else (page.key, id(page))] = page
    page.members.add(consumer)
    consumer.list_page = page
    hub.quiet(consumer, True)


def unshare(hub: Any, consumer: JobsConsumer) -> None:
    """``consumer`` leaves its page (it went away, fell behind or listens elsewhere) and takes pushes again."""
    page, consumer.list_page = consumer.list_page, None
    if page is not None:
        page.members.discard(consumer)
        if not page.members:
            for key in [key for key, other in hub.pages.items() if other is page]:
                del hub.pages[key]
    hub.quiet(consumer, False)


def server_connection(send: Any) -> Any:
    """The server's WebSocket connection behind an ASGI ``send`` (through channels' session wrapper), when it is
    uvicorn's sans-I/O protocol without extensions (no per-message compression): frames encoded here may then be
    written to its transport. Else None (the ASGI ``send`` is used)."""
    for _ in range(8):
        owner = getattr(send, "__self__", None)
        if owner is None:
            return None
        if type(owner).__name__ == "WebSocketsSansIOProtocol":
            conn = getattr(owner, "conn", None)
            ok = all(hasattr(owner, name) for name in ("transport", "writable", "close_sent", "disconnected"))
            return owner if ok and conn is not None and not getattr(conn, "extensions", None) else None
        send = getattr(owner, "real_send", None)
    return None


def _open(connection: Any) -> bool:
    return (connection.conn.state is State.OPEN and not connection.close_sent and not connection.disconnected
            and not connection.transport.is_closing())


class JobsConsumer(_CoalescingConsumer):
    """``ws/jobs/?<the list page's query string>&shown=<ids>&since=<when the page was drawn>``: the job list.

    Rows of the page change in place; a job that no longer matches the filters (e.g. ``phase=RUNNING`` after it
    ended) is removed; a job that comes to match on the first page is inserted where the order (newest first) puts
    it; elsewhere a "N new jobs — show" notice counts them. On (re)connect, and when the channel layer is back
    after an outage (``jobs.catchup``), rows that changed since the page was drawn (or the layer went) are sent."""

    async def connect(self) -> None:
        query = QueryDict(self.scope.get("query_string", b"").decode("latin-1"), mutable=True)
        page = query.get("page", "")
        self.page = int(page) if page.isdigit() and int(page) > 0 else 1
        shown = query.get("shown")
        self.client_shown = None if shown is None else {int(i) for i in shown.split(",") if i.isdigit()}
        self.since = parse_datetime(query.get("since", "")) if query.get("since") else None
        for key in LIST_PAGE_KEYS:
            query.pop(key, None)
        self.params = query.urlencode()
        self.filtered = any(v for v in query.values())
        self.first_page_url = "/" + (f"?{self.params}" if self.params else "")
        self.shown: set[int] = set()
        self.new_count = 0
        self.list_page: ListPage | None = None
        self.outbox: deque[OutFrames] = deque()
        self.outgoing: asyncio.Task | None = None
        self.connection = server_connection(getattr(self, "base_send", None))
        await super().connect()
        self._share_when_idle()

    @property
    def number(self) -> int:  # what ``list_frames`` reads of a page
        return self.page

    @property
    def size(self) -> int:
        return getattr(self, "page_size", 50)

    async def channel_groups(self) -> set[str] | None:
        return await user_channel_groups(self.user_id)

    async def _join(self, wanted: set[str]) -> None:
        if getattr(self, "list_page", None) is not None and set(wanted) != self.joined:
            self._leave_page()
        await super()._join(wanted)
        self._share_when_idle()

    def _share_when_idle(self) -> None:
        if (self.list_page is None and self.joined and self.caught_up.is_set() and self.sending is None
                and not self.buffer and not self.behind_since and not self.outbox):
            share(self.hub, self)

    def _leave_page(self) -> None:
        page = self.list_page
        if page is not None:
            self.shown, self.new_count = set(page.shown), page.new_count
            unshare(self.hub, self)

    async def _drain(self) -> None:
        await super()._drain()
        if self.joined:
            self._share_when_idle()

    # --- frames from the shared page -------------------------------------------------------------------------

    def page_frames(self, out: OutFrames) -> None:
        """One flush of this socket's page: written to the connection now if it takes it, else queued."""
        connection = self.connection
        if connection is not None and not self.outbox:
            if not _open(connection):
                return  # going away
            if connection.writable.is_set():
                connection.transport.write(out.wire)
            else:  # its send buffer is full: it is sent the newest rows once it takes more (coalesced)
                self._fall_behind(out)
            return
        self.outbox.append(out)
        if len(self.outbox) > OUTBOX_MAX:
            self._fall_behind(self.outbox[1])
        elif self.outgoing is None:
            self.outgoing = asyncio.ensure_future(self._send_outbox())

    async def _send_outbox(self) -> None:
        try:
            while self.outbox:
                for text in self.outbox[0].texts:
                    await self.send(text_data=text)
                self.outbox.popleft()
        except Exception as exc:
            self.outbox.clear()
            log.debug("live updates: a socket went away while being sent to (%r)", exc)
        finally:
            self.outgoing = None
            self._share_when_idle()

    def _fall_behind(self, dropped: OutFrames) -> None:
        """This socket will not be sent ``dropped`` (nor what follows): it keeps the flush being sent, leaves its
        page with the state before ``dropped``, and catches up from when that was made (from the hub's ring)."""
        while self.outbox and self.outbox[-1] is not dropped:
            self.outbox.pop()
        if self.outbox:
            self.outbox.pop()
        unshare(self.hub, self)
        self.shown, self.new_count = set(dropped.before[0]), dropped.before[1]
        self.client_shown = set(self.shown)  # what it was sent: the ring brings it up to date from there
        self.hub_catch_up(datetime.fromtimestamp(dropped.at, UTC) - catchup.MARGIN)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "outgoing", None):
            self.outgoing.cancel()
        if getattr(self, "list_page", None) is not None:
            unshare(self.hub, self)
        await super().disconnect(code)

    # --- alone: catching up, and the pushes that came meanwhile -----------------------------------------------

    async def catch_up(self, since: datetime | None = None) -> list[str]:
        """What changed since the page was drawn (on connect) or since ``since`` (the layer was away, or the socket
        fell behind): from the changes the process heard (``Hub.recent``) if they reach back that far, else the
        page's rows again if any changed (``catchup.list_page``: one narrow query unless they did)."""
        from .views import PAGE_SIZE

        self.page_size = PAGE_SIZE
        if self.outgoing is not None and self.outgoing is not asyncio.current_task():
            await asyncio.wait([self.outgoing])  # what is being sent goes first
        if self.connection is not None:
            await self.connection.writable.wait()  # then the newest rows, once the connection takes more
        self._leave_page()
        if since is not None and self.client_shown is not None:  # the page shows what this socket sent it
            self.client_shown, self.since = set(self.shown), since
        # What this process heard since the page was drawn, if it heard all of it (unfiltered pages).
        heard = None if self.filtered or self.client_shown is None or self.since is None else self.hub.recent(
            self.joined, (self.since - catchup.MARGIN).timestamp())
        if heard is not None:
            self.shown = set(self.client_shown)
            return self.list_update(heard, None)
        self.shown, html = await self.hub.read_once(
            catchup.list_page, self.user_id, self.params, self.page,
            None if self.client_shown is None else frozenset(self.client_shown), self.since)
        self.shown = set(self.shown)
        return [html]

    async def frame(self, items: dict[int, dict[str, Any]]) -> list[str]:
        matched = await self.hub.matching(self.params, frozenset(items)) if self.filtered else None
        return self.list_update(items, matched)

    def list_update(self, items: dict[int, dict[str, Any]], matched: set[int] | None) -> list[str]:
        """This socket's frames for ``items`` (alone), made once per flush for the sockets whose pages are alike."""
        memo = self.hub.frames
        key = (self.params, self.page, self.size, frozenset(self.shown), self.new_count,
               tuple((job_id, items[job_id]["row"]) for job_id in sorted(items)),
               None if matched is None else frozenset(matched))
        if key not in memo:
            shown = set(self.shown)
            frames, count = list_frames(self, shown, self.new_count, items, matched)
            memo[key] = (frames, frozenset(shown), count)
        frames, self.shown, self.new_count = memo[key][0], set(memo[key][1]), memo[key][2]
        return frames
