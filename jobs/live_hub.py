"""The hub: live updates fanned out to the sockets of one web process.

Fan-out does not grow with the number of sockets per message: sockets are not members of layer groups. Each web
process has one ``Hub`` (one layer channel) that joins the groups its sockets need (the audiences of
``jobs.live_publisher``), receives each change once, keeps the newest row per job and every ``FLUSH_SECONDS`` hands
every socket the rows of its groups; the consumer (``jobs.consumers``) turns them into htmx out-of-band swaps for its
page (replace, insert, delete) and sends one frame.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer

from . import catchup, channel_auth
from .live_publisher import GPUS_CHANGED, job_channel

log = logging.getLogger(__name__)

# A web process hands its sockets what changed at most this often (a burst of changes of one job: its last state).
FLUSH_SECONDS = 0.05
# The changes a process heard last, for sockets that (re)connect: they catch up from here, not from the database.
RING_SIZE = 10000  # about 10 MB of rows


class Hub:
    """One per event loop (a web process): a single channel of the layer that joins the groups its sockets need.
    Each change arrives here once however many sockets listen; the newest row per job is kept and every
    ``FLUSH_SECONDS`` each socket is handed the rows of its groups (``consumer.hub_push(items)``, where it keeps
    the newest per job until its own send is done). Sockets are never members of layer groups, so one that goes
    away leaves nothing behind in Redis; the hub leaves a group when its last socket does. Its ``watch``
    (``jobs.catchup.LayerWatch``) notices when the layer was away and has every socket catch up."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.loop = asyncio.get_running_loop()
        self.channel: str | None = None
        self.listeners: dict[str, set[Any]] = {}  # group → sockets of this process
        self.pushed: dict[str, set[Any]] = {}  # group → the sockets of it handed their items (``hub_push``)
        self.quieted: set[Any] = set()  # sockets on a shared page (``jobs.live_list``), handed nothing themselves
        self.pages: dict[Any, Any] = {}  # state → ``live_list.ListPage``
        self.pending: dict[str, dict[int, dict[str, Any]]] = {}
        self.flush_handle: asyncio.TimerHandle | None = None
        self.tasks: list[asyncio.Task] = []
        self.lock = asyncio.Lock()
        self.matches: dict[tuple[str, frozenset[int]], asyncio.Future] = {}
        self.reads: dict[tuple[Any, ...], asyncio.Future] = {}  # reads under way (``read_once``)
        # Frames made in this flush, by everything they depend on: sockets whose pages are alike share them.
        self.frames: dict[tuple[Any, ...], Any] = {}
        self.ring: deque[tuple[str, dict[str, Any]]] = deque(maxlen=RING_SIZE)  # (layer group, item), oldest first
        self.covered: dict[str, float] = {}  # layer group → since when every change of it is in the ring
        self.watch = catchup.LayerWatch(self)  # notices outages of the layer; the sockets then catch up

    async def set_groups(self, consumer: Any, groups: set[str]) -> None:
        """Listen to these groups (and no others) for ``consumer``: job groups, ``jobs.all`` or ``job_channel(id)``."""
        async with self.lock:
            if self.channel is None:
                self.channel = await self.layer.new_channel("jobsite.hub.")
                ping = not isinstance(self.layer, InMemoryChannelLayer)  # that one never drops a message
                self.tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self.watch.run(ping))]
            for name in sorted(groups):
                members = self.listeners.setdefault(name, set())
                if not members:
                    await self._layer_join(name)
                members.add(consumer)
                if consumer not in self.quieted:
                    self.pushed.setdefault(name, set()).add(consumer)
            await self._drop(consumer, keep=groups)

    def quiet(self, consumer: Any, quiet: bool) -> None:
        """Whether ``consumer`` is handed nothing itself (its shared page sends it its frames) or its items."""
        if quiet:
            self.quieted.add(consumer)
        else:
            self.quieted.discard(consumer)
        for name, members in self.listeners.items():
            if consumer in members:
                if quiet:
                    self.pushed.get(name, set()).discard(consumer)
                else:
                    self.pushed.setdefault(name, set()).add(consumer)

    async def leave(self, consumer: Any) -> None:
        async with self.lock:
            self.quieted.discard(consumer)
            await self._drop(consumer, keep=set())
            if not self.listeners and self.channel is not None:
                for task in self.tasks:
                    task.cancel()
                self.tasks, self.channel = [], None
                if _hubs.get(self.loop) is self:
                    del _hubs[self.loop]

    async def _layer_join(self, name: str) -> None:
        try:
            await self.layer.group_add(name, self.channel)
            self.covered[name] = time.time()
        except Exception as exc:  # the layer is away: joined again, and the sockets caught up, when it is back
            log.warning("could not join channel group %s: %r", name, exc)
            self.watch.lost()

    async def _drop(self, consumer: Any, keep: set[str]) -> None:
        for name in [n for n, members in self.listeners.items() if consumer in members and n not in keep]:
            self.listeners[name].discard(consumer)
            self.pushed.get(name, set()).discard(consumer)
            if self.listeners[name]:
                continue
            del self.listeners[name]
            self.pushed.pop(name, None)
            self.covered.pop(name, None)
            try:
                await self.layer.group_discard(name, self.channel)
            except Exception as exc:  # a disconnect must never fail; group_expiry ends the membership
                log.warning("could not leave channel group %s: %r", name, exc)

    def groups(self) -> set[str]:
        """The layer groups this process listens to (it joins each group a socket of it listens to)."""
        return set(self.listeners)

    async def _receive(self) -> None:
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("live updates: receiving failed (%r); retrying", exc)
                await asyncio.sleep(1)
                continue
            if not channel_auth.accept(message, self.channel):  # unsigned, forged, another installation's, stale
                continue
            if self.watch.pong(message):
                continue
            group = message.get("group")
            if message.get("type") == GPUS_CHANGED and group in self.listeners:
                self._gpus_changed(message.get("items", ()))
                continue
            if message.get("type") != "jobs.changed" or group not in self.listeners:
                continue
            bucket = self.pending.setdefault(group, {})
            for item in message.get("items", ()):
                self.ring.append((group, item))
                old = bucket.get(item["id"])
                if old is None or item["at"] >= old["at"]:
                    bucket[item["id"]] = item
            if self.flush_handle is None:
                self.flush_handle = self.loop.call_later(FLUSH_SECONDS, self._flush)

    def _gpus_changed(self, items: Iterable[dict[str, Any]]) -> None:
        """New GPU readings of these jobs (``live_publisher.publish_gpu_changes``): their detail sockets redraw
        their GPU card (``hub_gpus``). Once a sampling round, so not held for a flush."""
        for item in items:
            for consumer in list(self.listeners.get(job_channel(item["id"]), ())):
                if hasattr(consumer, "hub_gpus"):
                    consumer.hub_gpus()

    def _flush(self) -> None:
        self.flush_handle = None
        pending, self.pending = self.pending, {}
        self.matches = {}
        self.frames = {}
        parts: dict[Any, list[dict[int, dict[str, Any]]]] = {}
        for name, members in self.pushed.items():
            items = pending.get(name)
            if items is None:
                continue
            for consumer in members:
                parts.setdefault(consumer, []).append(items)
        for consumer, found in parts.items():
            items = found[0] if len(found) == 1 else newest_items(found)
            try:
                consumer.hub_push(items)
            except Exception:
                log.exception("live updates: a socket failed to take its update")
        if self.pages:
            from .live_list import flush_pages

            flush_pages(self, pending)

    def recent(self, groups: set[str], since: float) -> dict[int, dict[str, Any]] | None:
        """The newest item per job of ``groups`` heard at or after ``since`` (a timestamp), or None if the ring may
        lack some: a group joined later, the ring overflowed since, or the layer is away (then read the database)."""
        if self.watch.gap is not None or any(self.covered.get(name, since + 1) > since for name in groups):
            return None
        if len(self.ring) == self.ring.maxlen and self.ring[0][1]["at"] >= since:
            return None
        items: dict[int, dict[str, Any]] = {}
        for group, item in self.ring:
            if group in groups and item["at"] >= since and item["at"] >= items.get(item["id"], item)["at"]:
                items[item["id"]] = item
        return items

    async def matching(self, params: str, ids: frozenset[int]) -> set[int]:
        """The ids of ``ids`` that match the list filters ``params`` (a query string): one query per flush for all
        the sockets with the same filters."""
        from channels.db import database_sync_to_async

        key = (params, ids)
        future = self.matches.get(key)
        if future is None:
            future = self.matches[key] = asyncio.ensure_future(database_sync_to_async(matching_ids)(params, ids))
        return await asyncio.shield(future)


    async def read_once(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in the database thread, read once for the sockets that ask for it while it is under way
        (a thousand alike pages catching up after an outage: one query). ``args`` hashable. The first asker reads
        at once (no hop through another task: its read is queued before what its caller does next)."""
        from channels.db import database_sync_to_async

        key = (fn, *args)
        while (future := self.reads.get(key)) is not None:
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                if not future.cancelled():
                    raise  # this asker was cancelled
                # the reader was: read here
        future = self.reads[key] = self.loop.create_future()
        try:
            result = await database_sync_to_async(fn)(*args)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: the others raise it, none may be waiting
            raise
        finally:
            if self.reads.get(key) is future:
                del self.reads[key]
        future.set_result(result)
        return result


def newest_items(found: list[dict[int, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    items: dict[int, dict[str, Any]] = {}
    for bucket in found:
        for job_id, item in bucket.items():
            if job_id not in items or item["at"] >= items[job_id]["at"]:
                items[job_id] = item
    return items


def matching_ids(params: str, ids: Iterable[int]) -> set[int]:
    """Which of these jobs the list filters ``params`` (the list page's query string) keep (visibility aside:
    sockets only hear of the groups their user may see)."""
    from django.http import QueryDict

    from .filtersets import JobFilterSet
    from .models import Job

    filters = JobFilterSet(QueryDict(params), queryset=Job.objects.filter(pk__in=list(ids)))
    return set(filters.qs.values_list("pk", flat=True))


_hubs: dict[asyncio.AbstractEventLoop, Hub] = {}


def hub() -> Hub:
    """The hub of the running loop (made on first use)."""
    loop = asyncio.get_running_loop()
    layer = get_channel_layer()
    current = _hubs.get(loop)
    if current is None or current.layer is not layer:
        current = _hubs[loop] = Hub(layer)
    return current
