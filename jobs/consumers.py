"""WebSocket consumers: a group's queue, utilisation (HTML for htmx's ws extension) and the log viewer's stream;
the job list is ``jobs.live_list`` (frames shared by alike pages), one job's detail page ``jobs.live_detail``.

Authentication happens at the edge (``jobsite.asgi``: allowed hosts/origin, session); every consumer closes
anonymous connections and checks permission before it listens. Memberships are checked again every
``RECHECK_SECONDS``, so someone removed from a group stops hearing about it (the sockets of a process recheck
together, at the same ticks of the clock, and alike checks under way are made once: ``Hub.read_once``).

Sockets are not members of channel-layer groups: they listen at their process's hub (``jobs.live_hub.Hub``), which
hears each change once and hands every socket the rows of its groups, at most every ``live_hub.FLUSH_SECONDS``.
A consumer keeps the newest row per job until its previous frame is sent (a burst of changes of one job: one frame,
its last state). It sends htmx out-of-band swaps of the pages' own fragments: rows of ``jobs/_job_row.html``
(``hx-swap-oob="true"``), inserts (``afterbegin:#job-rows``), deletes, the detail page's head, status, attempts."""

from __future__ import annotations

import asyncio
import codecs
import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils.html import escape

from . import live_hub, live_publisher, logs, selectors
from .choices import TERMINAL_PHASES
from .models import Attempt, Job, Membership

log = logging.getLogger(__name__)

RECHECK_SECONDS = 60.0
MAX_FOLLOWED_LOGS = 16
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
# Pages redrawn whole (a group's queue, utilisation) are asked to refetch their block at most this often.
REFRESH_SECONDS = 0.5
# The list's query-string keys that are not filters.
LIST_PAGE_KEYS = ("page", "since", "shown")


def channel_groups_of(user_id: int) -> frozenset[str] | None:
    """The channel groups a user may listen to, or None if the user is gone or inactive."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return None
    if user.is_superuser:
        return frozenset({live_publisher.GROUP_ALL})
    group_ids = Membership.objects.filter(user=user).values_list("group_id", flat=True)
    return frozenset(live_publisher.group_channel(gid) for gid in group_ids)


async def user_channel_groups(user_id: int) -> frozenset[str] | None:
    """``channel_groups_of`` for a socket: read once for the sockets of the user that ask at the same time."""
    return await live_hub.hub().read_once(channel_groups_of, user_id)


def with_oob(html: str, swap: str = "true") -> str:
    """``html`` (one element) with ``hx-swap-oob`` on its first tag: the page's fragment, swapped in by id."""
    html = html.strip()
    end = html.index(">")
    if html[end - 1] == "/":
        end -= 1
    return f'{html[:end]} hx-swap-oob="{swap}"{html[end:]}'


class _AuthenticatedConsumer(AsyncJsonWebsocketConsumer):
    """Closes anonymous sockets; listens at the hub to ``channel_groups()`` and keeps them in step with the user's
    memberships. What the hub hands over arrives in ``hub_push(items)`` (job id → ``{id, group_id, phase, row,
    at}``), called on the event loop; the default hands each item to ``job_updated``."""

    # Not on the channel layer itself: no layer channel per socket (the hub has one per process).
    channel_layer_alias = "jobsite-sockets-use-the-hub"

    async def connect(self) -> None:
        self.joined: set[str] = set()
        self.recheck_task: asyncio.Task | None = None
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.user_id = user.pk
        wanted = await self.channel_groups()
        if wanted is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        live_publisher.register_consumer_loop()
        self.hub = live_hub.hub()
        await self._join(wanted)
        await self.accept()
        self.recheck_task = asyncio.create_task(self._recheck())

    async def channel_groups(self) -> set[str] | None:
        raise NotImplementedError

    async def _join(self, wanted: set[str]) -> None:
        await self.hub.set_groups(self, wanted)
        self.joined = set(wanted)

    async def _recheck(self) -> None:
        while True:
            await asyncio.sleep(RECHECK_SECONDS - time.time() % RECHECK_SECONDS)  # with the process's other sockets
            try:
                wanted = await self.channel_groups()
            except Exception:
                log.exception("rechecking the permissions of a socket failed")
                continue
            if wanted is None:
                await self.close(code=CLOSE_FORBIDDEN)
                return
            await self._join(wanted)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "recheck_task", None):
            self.recheck_task.cancel()
        if getattr(self, "hub", None) is not None:
            await self.hub.leave(self)
        self.joined = set()

    def hub_push(self, items: dict[int, dict[str, Any]]) -> None:
        for item in items.values():
            asyncio.ensure_future(self.job_updated({"type": "job.updated", **item}))

    def hub_catch_up(self, since: datetime) -> None:
        """The layer was away from ``since`` (``jobs.catchup``): what changed meanwhile was not heard. By default
        as a change (pages redrawn whole refetch their block)."""
        self.hub_push({})

    async def job_updated(self, message: dict[str, Any]) -> None:
        pass

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        pass  # the stream is one-way

    async def send_html(self, html: str) -> None:
        await self.send(text_data=html)


class _CoalescingConsumer(_AuthenticatedConsumer):
    """Keeps the newest item per job until its previous frame is out, then sends what ``frame(items)`` makes of
    them as one frame."""

    async def connect(self) -> None:
        self.buffer: dict[int, dict[str, Any]] = {}
        self.sending: asyncio.Task | None = None
        self.behind_since: datetime | None = None  # the layer was away from then: catch up before the next frame
        self.caught_up = asyncio.Event()  # frames wait for what the socket sends first
        await super().connect()
        if self.joined:
            for html in await self.catch_up():
                if html:
                    await self.send_html(html)
        self.caught_up.set()

    async def catch_up(self, since: datetime | None = None) -> list[str]:
        """What the page missed between being drawn and its socket opening, or (``since``) while the layer was away
        from then (frames, as ``frame``)."""
        return []

    def hub_push(self, items: dict[int, dict[str, Any]]) -> None:
        for job_id, item in items.items():
            old = self.buffer.get(job_id)
            if old is None or item["at"] >= old["at"]:
                self.buffer[job_id] = item
        if self.sending is None:
            self.sending = asyncio.ensure_future(self._drain())

    def hub_catch_up(self, since: datetime) -> None:
        self.behind_since = min(since, self.behind_since or since)
        self.hub_push({})

    async def _drain(self) -> None:
        try:
            await self.caught_up.wait()
            while self.buffer or self.behind_since:
                items, self.buffer, since, self.behind_since = self.buffer, {}, self.behind_since, None
                # A catch-up reads the page anew (the rows buffered are older than what it reads).
                for html in await (self.catch_up(since) if since else self.frame(items)):
                    if html:
                        await self.send_html(html)
        except Exception as exc:
            if type(exc).__name__ in ("ConnectionClosed", "ConnectionClosedOK", "ConnectionClosedError",
                                      "InvalidState", "ClientDisconnected"):
                log.debug("live updates: a socket went away while being sent to")
            else:
                log.exception("live updates: could not send to a socket")
        finally:
            self.sending = None

    async def frame(self, items: dict[int, dict[str, Any]]) -> list[str]:
        """The frames that bring the page up to date. Table parts travel apart: a fragment is parsed as one piece
        of HTML, in which top-level rows and ``<tbody>`` wrappers do not mix with each other or with other
        elements (the parser would drop or re-wrap them)."""
        raise NotImplementedError

    async def disconnect(self, code: int) -> None:
        if getattr(self, "sending", None):
            self.sending.cancel()
        await super().disconnect(code)


class QueueConsumer(_AuthenticatedConsumer):
    """``ws/groups/<name>/queue/``: a change of a job of the group asks the page to refetch its block (quota bars,
    usage and the waiting jobs are drawn together by ``jobs/_queue_live.html``), at most every REFRESH_SECONDS."""

    async def connect(self) -> None:
        self.group_name = self.scope["url_route"]["kwargs"]["name"]
        self.refresh_due = False
        await super().connect()

    async def channel_groups(self) -> set[str] | None:
        return await database_sync_to_async(self._groups)()

    def _groups(self) -> set[str] | None:
        user = get_user_model().objects.filter(pk=self.user_id, is_active=True).first()
        group = user and selectors.groups_of(user).filter(name=self.group_name).first()
        return {live_publisher.group_channel(group.pk)} if group else None

    def hub_push(self, items: dict[int, dict[str, Any]]) -> None:
        if not self.refresh_due:
            self.refresh_due = True
            self.refresh_task = asyncio.ensure_future(self._refresh_later())

    async def _refresh_later(self) -> None:
        await asyncio.sleep(REFRESH_SECONDS)
        self.refresh_due = False
        await self.send_html(refresh_trigger(self.refresh_url(), self.target))

    target = "#queue-live"

    def refresh_url(self) -> str:
        from django.urls import reverse

        query = self.scope.get("query_string", b"").decode("latin-1")
        return reverse("jobs:queue", args=[self.group_name]) + (f"?{query}" if query else "")

    async def disconnect(self, code: int) -> None:
        if getattr(self, "refresh_task", None):
            self.refresh_task.cancel()
        await super().disconnect(code)


def refresh_trigger(url: str, target: str) -> str:
    """An element that makes htmx fetch ``url`` (a real htmx request) and swap its ``target`` block in place."""
    url, target = escape(url), escape(target)
    return (f'<div id="live-refresh" hx-swap-oob="true" hidden hx-get="{url}" hx-trigger="load" '
            f'hx-target="{target}" hx-select="{target}" hx-swap="outerHTML"></div>')


class UtilisationConsumer(QueueConsumer):
    """``ws/utilisation/``: any change asks the page to refetch its block, at most every REFRESH_SECONDS."""

    target = "#util-live"

    async def connect(self) -> None:
        self.refresh_due = False
        await _AuthenticatedConsumer.connect(self)

    async def channel_groups(self) -> set[str] | None:
        groups = await user_channel_groups(self.user_id)
        return None if groups is None else {live_publisher.UTILISATION}

    def refresh_url(self) -> str:
        from django.urls import reverse

        return reverse("jobs:utilisation")


class _OneJobMixin:
    """Sockets of one job's page (``self.job_id``): for those who may see the job, on its channel only."""

    job_id: int
    user_id: int

    async def channel_groups(self) -> set[str] | None:
        visible = await database_sync_to_async(self._visible)()
        return {live_hub.job_channel(self.job_id)} if visible else None

    def _visible(self) -> bool:
        user = get_user_model().objects.filter(pk=self.user_id, is_active=True).first()
        return user is not None and selectors.jobs_visible_to(user).filter(pk=self.job_id).exists()


# --- the live log viewer (static/js/logview.js) -------------------------------------------------------------


class JobLogConsumer(_OneJobMixin, _AuthenticatedConsumer):
    """``ws/jobs/<id>/logs/``: the replica logs of one job that the page's viewers follow, at whatever rate they
    grow, and the job's phase (``job.phase``: a viewer stops following once the job has ended).

    Client messages: ``{"type": "log.follow", "attempt": n, "rank": r, "offset": <bytes>}``, ``log.unfollow``
    (same keys) and ``{"type": "log.ack", "attempt": n, "rank": r, "end": <bytes>}`` once a piece is shown. One
    piece per log is in flight until acknowledged; a reader then more than ``logs.FOLLOW_WINDOW_BYTES`` behind
    gets ``log.skipped`` ``{from, to}`` and only the last window (it fetches skipped bytes by range if wanted), so a
    log written at any rate is shown up to its newest line.
    Server messages: ``log.appended`` ``{offset, end, size, text}``, ``log.skipped``, ``log.reset``, ``log.error``.
    """

    async def connect(self) -> None:
        self.job_id = int(self.scope["url_route"]["kwargs"]["pk"])
        self.tails: dict[tuple[int, int], asyncio.Task] = {}
        self.acked: dict[tuple[int, int], int] = {}
        self.ack_events: dict[tuple[int, int], asyncio.Event] = {}
        self.phase: str | None = None
        await super().connect()
        if self.joined:
            await self._catch_up_phase()

    def hub_catch_up(self, since: datetime) -> None:
        asyncio.ensure_future(self._catch_up_phase())

    async def _catch_up_phase(self) -> None:
        phase = await database_sync_to_async(
            lambda: Job.objects.filter(pk=self.job_id).values_list("phase", flat=True).first())()
        if phase:
            await self._send_phase(phase)

    async def _send_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            await self.send_json({"type": "job.phase", "phase": phase, "finished": phase in TERMINAL_PHASES})

    async def job_updated(self, message: dict[str, Any]) -> None:
        if message.get("id") == self.job_id and message.get("phase"):
            await self._send_phase(message["phase"])

    async def disconnect(self, code: int) -> None:
        for task in getattr(self, "tails", {}).values():
            task.cancel()
        await super().disconnect(code)

    def _log_path(self, number: int, rank: int) -> Path | None:
        attempt = Attempt.objects.filter(job_id=self.job_id, number=number).first()
        if attempt is None or not 0 <= rank < attempt.replicas:
            return None
        return logs.log_path(attempt, rank)

    async def _acknowledged(self, key: tuple[int, int], end: int) -> None:
        event = self.ack_events.setdefault(key, asyncio.Event())
        while self.acked.get(key, -1) < end:
            event.clear()
            await event.wait()

    async def _follow(self, number: int, rank: int, offset: int) -> None:
        key = (number, rank)
        fields = {"attempt": number, "rank": rank}
        path = await database_sync_to_async(self._log_path)(number, rank)
        if path is None:
            await self.send_json({"type": "log.error", **fields, "message": "No such replica."})
            return
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        interval = settings.JOBSITE_LOG_FOLLOW_INTERVAL
        seen: int | None = None  # the size at the step before
        while True:
            # A line still being written waits for its end, unless the log has stopped growing there.
            step = await asyncio.to_thread(logs.follow_step, path, offset, whole_lines=True)
            if not step.data and step.size is not None and step.size > step.start and step.size == seen:
                step = await asyncio.to_thread(logs.follow_step, path, offset)
            seen = step.size
            if step.size is not None and step.size < offset:  # truncated or replaced: start over
                offset = 0
                decoder.reset()
                await self.send_json({"type": "log.reset", **fields, "offset": 0})
                continue
            if step.skipped_from is not None:
                decoder.reset()
                await self.send_json({"type": "log.skipped", **fields, "from": step.skipped_from, "to": step.start,
                                      "size": step.size})
                offset = step.start
            if not step.data:
                await asyncio.sleep(interval)
                continue
            await self.send_json({"type": "log.appended", **fields, "offset": step.start, "end": step.end,
                                  "size": step.size, "text": decoder.decode(step.data)})
            offset = step.end
            await self._acknowledged(key, offset)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            return
        kind = content.get("type")
        if kind not in ("log.follow", "log.unfollow", "log.ack"):
            return
        number, rank = content.get("attempt"), content.get("rank")
        position = content.get("end" if kind == "log.ack" else "offset", 0)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (number, rank, position)):
            return
        key = (number, rank)
        if kind == "log.ack":
            self.acked[key] = max(self.acked.get(key, -1), position)
            if key in self.ack_events:
                self.ack_events[key].set()
            return
        task = self.tails.pop(key, None)
        if task:
            task.cancel()
        self.acked.pop(key, None)
        if kind == "log.follow" and len(self.tails) < MAX_FOLLOWED_LOGS:
            self.tails[key] = asyncio.create_task(self._follow(number, rank, position))
