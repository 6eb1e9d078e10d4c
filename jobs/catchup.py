"""Catching up: bringing a live page up to date after a gap in what its socket heard, without a reload.

Live updates are at most once (Redis pub/sub keeps nothing): a change published while the layer is down, or while a
web process's subscription is being re-established, reaches no one. Three things close such gaps:

- **A socket that (re)connects** reads what its page misses: the list reads its page's ids and change times (one
  narrow query, ``list_page``) and redraws its rows only if they changed; the detail page draws what it lacks.
- **Each web process's hub watches its link** (``LayerWatch``, one per ``live_hub.Hub`` on a Redis layer): every
  ``PING_SECONDS`` the hub sends itself a signed ping through the layer and waits for it to come back through its
  subscription. A ping that cannot be sent or is not back within ``PING_TIMEOUT_SECONDS`` opens a gap (logged
  once); the first one back after it closes the gap: the hub joins its groups again (a Redis that restarted
  forgot them), then tells every socket of the process to catch up from the last ping that came back
  (``consumer.hub_catch_up(since)``), which is the reconnect path again. One catch-up per socket per outage,
  nothing per message. The watch also renews the hub's group memberships every ``GROUP_RENEW_SECONDS``.
- **A publisher that could not send** (``live_publisher._Publisher``) keeps the jobs' ids (``Resend``) and sends them
  again, rendered as they are by then, 1 s, 2 s, 4 s… later (at most ``RESEND_MAX_SECONDS`` apart) until a send
  succeeds: a process that lost the layer while the web processes kept it (they saw no gap) still delivers. Above
  ``RESEND_MAX_JOBS`` jobs it keeps none and leaves the pages to their hubs' catch-up.

A subscription lost and regained between two pings (Redis back within half a second, or a message dropped with the
connection) goes unnoticed; a failed publish in it is still sent again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from . import channel_auth
from .choices import Phase

log = logging.getLogger(__name__)

PING = "jobs.ping"
PING_SECONDS = 0.5
PING_TIMEOUT_SECONDS = 5.0
# Layer group memberships expire (the list layer's group_expiry): renewed this often while sockets listen.
GROUP_RENEW_SECONDS = 60.0
RESEND_FIRST_SECONDS = 1.0
RESEND_MAX_SECONDS = 30.0
RESEND_MAX_JOBS = 1000
# The list page counts a row as changed if it changed this long before the gap began (a page is drawn, or a change
# published, a little after its commit).
MARGIN = timedelta(seconds=2)
# A row drawn for a catch-up serves the others that need that job in the same state this long (a thousand sockets
# catching up after an outage draw each row once, as one change is drawn once for all).
ROW_REUSE_SECONDS = 10.0
ROWS_KEPT = 5000
_drawn: dict[int, tuple[tuple[Any, ...], float, str]] = {}  # job id → (its state, when drawn, row)


class LayerWatch:
    """The link of one hub (``live_hub.Hub``: ``layer``, ``channel``, ``listeners``: the groups it joins) to the layer.
    ``run`` is one of the hub's tasks; the hub hands it every authentic message of type ``PING`` (``pong``)."""

    def __init__(self, hub: Any) -> None:
        self.hub = hub
        self.last_ok = time.time()  # when the last ping that came back was sent
        self.gap: float | None = None  # since when the layer may have lost messages, while it is not back
        self.waiting: tuple[str, asyncio.Future] | None = None
        self.pings = self.outages = 0  # pings that came back, gaps closed

    async def run(self, ping: bool = True) -> None:
        """Ping (unless ``ping`` is False: a layer that never drops a message) and renew the memberships."""
        renew_at = time.monotonic() + GROUP_RENEW_SECONDS
        while True:
            if not ping or await self._ping():
                if self.gap is not None:
                    await self._recover()
                elif time.monotonic() >= renew_at:
                    renew_at = time.monotonic() + GROUP_RENEW_SECONDS
                    if not await self.rejoin():
                        self.lost()
            elif self.gap is None:
                self.lost()
            await asyncio.sleep(PING_SECONDS if ping else GROUP_RENEW_SECONDS)

    def lost(self) -> None:
        """The layer may have dropped messages for this process (a ping lost, a group not joined)."""
        if self.gap is None:
            self.gap = self.last_ok
            log.warning("live updates: the channel layer is unavailable; pages catch up when it is back")

    async def _ping(self) -> bool:
        token, sent = uuid.uuid4().hex, time.time()
        self.waiting = (token, self.hub.loop.create_future())
        try:
            message = channel_auth.sign({"type": PING, "group": self.hub.channel, "items": [token]})
            # In a gap a lost ping is only a reason to send the next one soon.
            await asyncio.wait_for(self._round_trip(message), PING_TIMEOUT_SECONDS if self.gap is None else 1.0)
        except asyncio.CancelledError:
            raise
        except Exception:  # not sent, or not back in time
            return False
        finally:
            self.waiting = None
        self.last_ok = sent
        self.pings += 1
        return True

    async def _round_trip(self, message: dict[str, Any]) -> None:
        _, back = self.waiting
        await self.hub.layer.send(self.hub.channel, message)
        await back

    def pong(self, message: dict[str, Any]) -> bool:
        """Whether ``message`` (authentic) is a ping: the hub then takes it no further."""
        if message.get("type") != PING:
            return False
        if self.waiting and message.get("items") == [self.waiting[0]] and not self.waiting[1].done():
            self.waiting[1].set_result(None)
        return True

    async def rejoin(self) -> bool:
        """Join the hub's layer groups again (idempotent); False if one could not be joined."""
        for name in list(self.hub.listeners):
            try:
                await self.hub.layer.group_add(name, self.hub.channel)
            except Exception as exc:
                log.warning("live updates: could not join channel group %s: %r", name, exc)
                return False
        return True

    async def _recover(self) -> None:
        if not await self.rejoin():
            return  # still away: the gap stays open
        gap, self.gap = self.gap, None
        self.hub.covered = dict.fromkeys(self.hub.listeners, time.time())  # what the ring holds from before is partial
        self.outages += 1
        since = datetime.fromtimestamp(gap, UTC)
        sockets = {consumer for members in list(self.hub.listeners.values()) for consumer in members}
        log.warning("live updates: the channel layer is back after %.1f s; %d socket(s) catch up",
                    time.time() - gap, len(sockets))
        for consumer in sockets:
            try:
                consumer.hub_catch_up(since)
            except Exception:
                log.exception("live updates: a socket failed to catch up")


class Resend:
    """The ids of jobs a publisher (``live_publisher._Publisher``: ``loop``, ``layer``, ``submit``) could not send,
    handed back to it after a backoff; dropped if the layer was replaced meanwhile (a test's settings)."""

    def __init__(self, publisher: Any) -> None:
        self.publisher = publisher
        self.ids: set[int] = set()
        self.delay = 0.0
        self.handle: asyncio.TimerHandle | None = None

    def failed(self, ids: set[int]) -> str:
        """Keep ``ids`` to send again; says when (for the log)."""
        self.ids |= ids
        if len(self.ids) > RESEND_MAX_JOBS:
            self.ids = set()
            return "too many to send again: pages catch up when the layer is back"
        if self.handle is None:  # the backoff grows with each try that fails again
            self.delay = min(max(self.delay * 2, RESEND_FIRST_SECONDS), RESEND_MAX_SECONDS)
            self.handle = self.publisher.loop.call_later(self.delay, self._again)
        return f"sent again in {self.delay:.0f} s"

    def sent(self) -> None:
        self.delay = 0.0

    def _again(self) -> None:
        from channels.layers import get_channel_layer

        self.handle = None
        ids, self.ids = self.ids, set()
        if ids and get_channel_layer() is self.publisher.layer:
            self.publisher.submit(self.publisher.layer, ids)


def list_page(user_id: int, params: str, page: int, shown: set[int] | None,
              since: datetime | None) -> tuple[set[int], str]:
    """The job list's catch-up: (the ids of the page now, the frame that redraws its rows or ""). The page's ids and
    change times are read first (one narrow query); the rows are drawn only when the page's ids differ from
    ``shown`` or one of them changed after ``since`` (less ``MARGIN``), each from ``jobs/_job_row.html`` as
    ``live_publisher.render_rows`` draws a change, or as drawn for another socket just before. ``shown`` None: not a
    page (a script), nothing is sent."""
    from django.contrib.auth import get_user_model
    from django.http import QueryDict

    from . import selectors
    from .views import PAGE_SIZE

    user = get_user_model().objects.get(pk=user_id)
    jobs, _ = selectors.job_list(user, QueryDict(params), collapse_arrays=True)  # the page's query
    start = (page - 1) * PAGE_SIZE
    stamps = list(jobs[start:start + PAGE_SIZE].values_list(
        "id", "updated_at", "phase", "estimated_start", "estimate_basis"))  # the last two change apart
    ids = {stamp[0] for stamp in stamps}
    if shown is None:
        return ids, ""
    changed = since is not None and any(updated and updated >= since - MARGIN for _, updated, *_ in stamps)
    if ids == shown and not changed:
        return ids, ""
    if not stamps and shown:
        return ids, "".join(f'<tr id="job-{i}" hx-swap-oob="delete"></tr>' for i in sorted(shown))
    rows = _rows(stamps)
    body = "".join(rows[stamp[0]] for stamp in stamps if stamp[0] in rows)
    return set(rows), f'<tbody id="job-rows" hx-swap-oob="true">{body}</tbody>'  # what is sent


def _rows(stamps: list[tuple[Any, ...]]) -> dict[int, str]:
    """The row of each job (id, change time, phase, estimate), drawn unless drawn in that state within
    ``ROW_REUSE_SECONDS`` (its queue position is part of the state: derived, it changes without the job). A job
    gone is left out."""
    from . import selectors
    from .live_publisher import render_rows

    positions = selectors.queue_positions(stamp[0] for stamp in stamps if stamp[2] == Phase.PENDING)
    keys = {stamp[0]: (*stamp[1:], positions.get(stamp[0])) for stamp in stamps}
    now = time.monotonic()
    rows = {}
    for pk, key in keys.items():
        drawn = _drawn.get(pk)
        if drawn and drawn[0] == key and now - drawn[1] < ROW_REUSE_SECONDS:
            rows[pk] = drawn[2]
    if len(_drawn) > ROWS_KEPT:
        _drawn.clear()
    for item in render_rows(set(keys) - set(rows)):
        rows[item["id"]] = item["row"]
        _drawn[item["id"]] = (keys[item["id"]], now, item["row"])
    return rows
