"""WebSocket consumers: the live job stream, one job's detail (events and log tails) and utilisation pings.

Authentication happens at the edge (``jobsite.asgi``: allowed hosts/origin, session); every consumer closes
anonymous connections and checks permission before joining a channel group. Memberships are checked again
every ``RECHECK_SECONDS``, so someone removed from a group stops hearing about it.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import os
from pathlib import Path
from typing import Any

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from django.utils.dateformat import format as date_format

from . import logs, realtime, selectors
from .models import Attempt, JobEvent, Membership

log = logging.getLogger(__name__)

RECHECK_SECONDS = 60.0
# A followed log is sent in pieces of at most this many bytes; a log growing faster is sent without pausing.
LOG_CHUNK_BYTES = 256 * 1024
MAX_FOLLOWED_LOGS = 16
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


def channel_groups_of(user_id: int) -> set[str] | None:
    """The channel groups a user may listen to, or None if the user is gone or inactive."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return None
    if user.is_superuser:
        return {realtime.GROUP_ALL}
    group_ids = Membership.objects.filter(user=user).values_list("group_id", flat=True)
    return {realtime.group_channel(gid) for gid in group_ids}


class _AuthenticatedConsumer(AsyncJsonWebsocketConsumer):
    """Closes anonymous sockets; joins ``channel_groups()`` and keeps them in step with the user's memberships."""

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
        realtime.register_consumer_loop()
        await self._join(wanted)
        await self.accept()
        self.recheck_task = asyncio.create_task(self._recheck())

    async def channel_groups(self) -> set[str] | None:
        raise NotImplementedError

    async def _join(self, wanted: set[str]) -> None:
        for name in sorted(wanted - self.joined):
            await self.channel_layer.group_add(name, self.channel_name)
        for name in sorted(self.joined - wanted):
            await self.channel_layer.group_discard(name, self.channel_name)
        self.joined = set(wanted)

    async def _recheck(self) -> None:
        while True:
            await asyncio.sleep(RECHECK_SECONDS)
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
        for name in getattr(self, "joined", ()):
            await self.channel_layer.group_discard(name, self.channel_name)
        self.joined = set()

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels closes stale database connections before every handler, a hop to the one database thread per
        # message and socket: a change fanned out to N sockets would queue N hops. The channel-layer handlers here
        # touch the database only through database_sync_to_async, which does that itself.
        if message.get("type") in ("job.updated", "utilisation.changed"):
            await getattr(self, get_handler_name(message))(message)
            return
        await super().dispatch(message)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        pass  # the stream is one-way


class JobsConsumer(_AuthenticatedConsumer):
    """``ws/jobs/``: one ``job.updated`` message per change of a job the user may see."""

    async def channel_groups(self) -> set[str] | None:
        return await database_sync_to_async(channel_groups_of)(self.user_id)

    async def job_updated(self, message: dict[str, Any]) -> None:
        await self.send_json(message)


class UtilisationConsumer(_AuthenticatedConsumer):
    """``ws/utilisation/``: a ``utilisation.changed`` ping (no job data) at most every half second."""

    PING_SECONDS = 0.5

    async def channel_groups(self) -> set[str] | None:
        groups = await database_sync_to_async(channel_groups_of)(self.user_id)
        return None if groups is None else {realtime.UTILISATION}

    async def connect(self) -> None:
        self.ping_due = False
        await super().connect()

    async def utilisation_changed(self, message: dict[str, Any]) -> None:
        if not self.ping_due:
            self.ping_due = True
            self.ping_task = asyncio.create_task(self._ping_later())

    async def _ping_later(self) -> None:
        await asyncio.sleep(self.PING_SECONDS)
        self.ping_due = False
        await self.send_json({"type": "utilisation.changed"})

    async def disconnect(self, code: int) -> None:
        if getattr(self, "ping_task", None):
            self.ping_task.cancel()
        await super().disconnect(code)


def event_message(event: JobEvent) -> dict[str, Any]:
    local = timezone.localtime(event.time)
    return {
        "type": "event.created",
        "job": event.job_id,
        "id": event.pk,
        "time": event.time.isoformat(),
        "time_display": date_format(local, "Y-m-d H:i:s"),
        "event_type": event.type,
        "reason": event.reason,
        "message": event.message,
        "attempt": event.attempt.number if event.attempt_id else None,
    }


def read_log_bytes(path: Path, offset: int, limit: int) -> tuple[bytes, int | None]:
    """Up to ``limit`` bytes of the file from ``offset``, and the file's size (None if it does not exist)."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if offset >= size:
                return b"", size
            f.seek(offset)
            return f.read(min(limit, size - offset)), size
    except (FileNotFoundError, NotADirectoryError):
        return b"", None


class JobDetailConsumer(JobsConsumer):
    """``ws/jobs/<id>/``: that job's ``job.updated``, its new events (``event.created``) and the lines appended to
    the replica logs the page follows (``log.appended``).

    Client messages: ``{"type": "events.since", "after": <event id>}`` (catch up, then stream new events),
    ``{"type": "log.follow", "attempt": n, "rank": r, "offset": <bytes>}`` and ``{"type": "log.unfollow", ...}``.
    """

    async def connect(self) -> None:
        self.job_id = int(self.scope["url_route"]["kwargs"]["pk"])
        self.last_event: int | None = None
        self.tails: dict[tuple[int, int], asyncio.Task] = {}
        self.events_lock = asyncio.Lock()
        await super().connect()

    async def channel_groups(self) -> set[str] | None:
        visible = await database_sync_to_async(self._visible)()
        return {realtime.job_channel(self.job_id)} if visible else None

    def _visible(self) -> bool:
        user = get_user_model().objects.filter(pk=self.user_id, is_active=True).first()
        return user is not None and selectors.jobs_visible_to(user).filter(pk=self.job_id).exists()

    async def disconnect(self, code: int) -> None:
        for task in getattr(self, "tails", {}).values():
            task.cancel()
        await super().disconnect(code)

    async def job_updated(self, message: dict[str, Any]) -> None:
        await self.send_json(message)
        if self.last_event is not None:
            await self._send_events()

    # events

    def _events_after(self, after: int) -> list[dict[str, Any]]:
        events = JobEvent.objects.filter(job_id=self.job_id, pk__gt=after).select_related("attempt").order_by("id")
        return [event_message(e) for e in events[:500]]

    async def _send_events(self) -> None:
        async with self.events_lock:  # two updates in a row must not send an event twice
            for message in await database_sync_to_async(self._events_after)(self.last_event or 0):
                await self.send_json(message)
                self.last_event = message["id"]

    # logs

    def _log_path(self, number: int, rank: int) -> Path | None:
        attempt = Attempt.objects.filter(job_id=self.job_id, number=number).first()
        if attempt is None or not 0 <= rank < attempt.replicas:
            return None
        return logs.log_path(attempt, rank)

    async def _follow(self, number: int, rank: int, offset: int) -> None:
        path = await database_sync_to_async(self._log_path)(number, rank)
        key = {"attempt": number, "rank": rank}
        if path is None:
            await self.send_json({"type": "log.error", **key, "message": "No such replica."})
            return
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        interval = settings.JOBSITE_LOG_FOLLOW_INTERVAL
        while True:
            data, size = await asyncio.to_thread(read_log_bytes, path, offset, LOG_CHUNK_BYTES)
            if size is not None and size < offset:  # truncated or replaced: start over
                offset = 0
                decoder.reset()
                await self.send_json({"type": "log.reset", **key, "offset": 0})
                continue
            if data:
                text = decoder.decode(data)
                await self.send_json({"type": "log.appended", **key, "offset": offset, "end": offset + len(data),
                                      "text": text})
                offset += len(data)
                if len(data) == LOG_CHUNK_BYTES:
                    continue
            await asyncio.sleep(interval)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            return
        kind = content.get("type")
        if kind == "events.since":
            after = content.get("after")
            self.last_event = after if isinstance(after, int) and after >= 0 else 0
            await self._send_events()
        elif kind in ("log.follow", "log.unfollow"):
            number, rank, offset = content.get("attempt"), content.get("rank"), content.get("offset", 0)
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (number, rank, offset)):
                return
            task = self.tails.pop((number, rank), None)
            if task:
                task.cancel()
            if kind == "log.follow" and len(self.tails) < MAX_FOLLOWED_LOGS:
                self.tails[(number, rank)] = asyncio.create_task(self._follow(number, rank, offset))
