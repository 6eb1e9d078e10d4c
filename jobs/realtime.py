"""Live push: each change of a job is rendered once, as the row of the job list (``jobs/_job_row.html``, the
template the page itself is drawn from), and sent after commit as one channel-layer message per audience.

Audiences (channel-layer groups):
  ``jobs.group.<group id>``  the rows of that job group's changed jobs (its members' list, queue and detail pages)
  ``jobs.all``               every changed row (superusers)
  ``jobs.utilisation``       "something changed", without rows (the utilisation page)

``publish_job_changes`` is called from the after-commit hooks of ``jobs.services``. It never raises into its
caller: with the layer down the change is logged and sent again later, and pages catch up when the layer is back
(``jobs.catchup``).

Fan-out does not grow with the number of sockets per message: sockets are not members of layer groups. Each web
process has one ``Hub`` (one layer channel) that joins the groups its sockets need, receives each change once,
keeps the newest row per job and every ``FLUSH_SECONDS`` hands every socket the rows of its groups; the consumer
(``jobs.consumers``) turns them into htmx out-of-band swaps for its page (replace, insert, delete) and sends one
frame. With the in-memory layer (embedded default) the rows are rendered by the caller and handed to the loop the
consumers run on; with Redis a publisher thread renders and sends, so a caller in the scheduler never waits.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.utils import timezone

from . import catchup, channel_auth
from .choices import Phase
from .state_machine import color_for, color_name

log = logging.getLogger(__name__)

GROUP_ALL = "jobs.all"
JOB_PREFIX = "jobs.job."
UTILISATION = "jobs.utilisation"
# A web process hands its sockets what changed at most this often (a burst of changes of one job: its last state).
FLUSH_SECONDS = 0.05

MESSAGE_FIELDS = (
    "id", "name", "group_id", "group__name", "user__username", "instance_type__name", "replicas", "gpu",
    "phase", "status", "reason", "message", "queue_position", "over_quota", "exit_code", "job_type",
    "created_at", "updated_at", "admitted_at", "started_at", "finished_at", "current_attempt__number",
    "estimated_start", "estimate_basis",
)


def group_channel(group_id: int) -> str:
    return f"jobs.group.{group_id}"


def job_channel(job_id: int) -> str:
    """Not a layer group: sockets about one job listen to it at their process's hub, which hears every change
    (``jobs.all``) and hands them their job's."""
    return f"{JOB_PREFIX}{job_id}"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def job_message(row: dict[str, Any]) -> dict[str, Any]:
    """The ``job.updated`` message of one job, from a ``values(*MESSAGE_FIELDS)`` row. Only plain JSON types."""
    phase, status = row["phase"], row["status"] or Phase(row["phase"]).label
    return {
        "type": "job.updated",
        "id": row["id"],
        "name": row["name"],
        "group": row["group__name"],
        "user": row["user__username"],
        "instance_type": row["instance_type__name"],
        "replicas": row["replicas"],
        "gpu": row["gpu"],
        "job_type": row["job_type"],
        "phase": phase,
        "phase_label": Phase(phase).label,
        "status": status,
        "color": color_for(phase, status),
        "color_name": color_name(phase, status),
        "reason": row["reason"],
        "message": row["message"],
        "queue_position": row["queue_position"] if phase == Phase.PENDING else None,
        "over_quota": row["over_quota"],
        "exit_code": row["exit_code"],
        "attempt": row["current_attempt__number"],
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
        "admitted_at": _iso(row["admitted_at"]),
        "started_at": _iso(row["started_at"]),
        "finished_at": _iso(row["finished_at"]),
        "estimated_start": _iso(row["estimated_start"]) if phase == Phase.PENDING else None,
        "estimate_basis": row["estimate_basis"] if phase == Phase.PENDING else "",
        "estimate": estimate_text(phase, row["queue_position"], row["estimated_start"], row["estimate_basis"]),
    }


def estimate_text(phase: str, position: int | None, start: datetime | None, basis: str) -> str:
    """What a pending job shows of its estimated start: "est. start 14:20 (by history)", "est. start 18:00 at the
    latest (by deadlines)", the date too when it is
    not today (in the site's time zone), or "est. start not within 30 days"; empty for any other job."""
    if phase != Phase.PENDING:
        return ""
    if start is None:
        return "est. start not within 30 days" if position else ""
    local = timezone.localtime(start)
    shown = f"{local:%H:%M}" if local.date() == timezone.localdate() else f"{local:%Y-%m-%d %H:%M}"
    # By deadlines the jobs ahead were assumed to run to their deadlines: the latest it starts, said so.
    latest = " at the latest" if (basis or "deadlines") == "deadlines" else ""
    return f"est. start {shown}{latest} (by {basis or 'deadlines'})"


def job_messages(job_ids: Iterable[int]) -> list[tuple[int, dict[str, Any]]]:
    """(group id, message) of each job, read in one query."""
    from .models import Job

    ids = sorted({int(i) for i in job_ids})
    if not ids:
        return []
    rows = Job.objects.filter(pk__in=ids).order_by("id").values(*MESSAGE_FIELDS)
    return [(row["group_id"], job_message(row)) for row in rows]


# --- rendering: once per change, the row the list page draws -------------------------------------------------


def render_rows(job_ids: Iterable[int]) -> list[dict[str, Any]]:
    """One item per job: its list row rendered from ``jobs/_job_row.html`` (the template of the first load), its
    group and when it was rendered (the newest rendering of a job wins wherever two meet). One query."""
    from django.template.loader import get_template

    from . import selectors
    from .models import Job

    ids = sorted({int(i) for i in job_ids})
    if not ids:
        return []
    template = get_template("jobs/_job_row.html")
    jobs = Job.objects.filter(pk__in=ids).select_related("group", "user", "instance_type").order_by("id")
    jobs = selectors.with_queue_positions(jobs)  # derived where read, as the page does
    at = time.time()
    return [{"id": job.pk, "group_id": job.group_id, "phase": job.phase, "at": at,
             "row": template.render({"job": job}).strip()} for job in jobs]


def change_messages(items: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """One ``jobs.changed`` message per audience: each job group with its jobs' rows, superusers with all of them,
    and the utilisation page (no rows: "something changed")."""
    by_group: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        by_group.setdefault(group_channel(item["group_id"]), []).append(item)
    sends = [(name, rows) for name, rows in by_group.items()] + ([(GROUP_ALL, items)] if items else [])
    sends.append((UTILISATION, []))
    # Signed (jobs.channel_auth): the hubs drop whatever else arrives on their channel.
    return [(name, channel_auth.sign({"type": "jobs.changed", "group": name, "items": rows})) for name, rows in sends]


def publish_job_changes(job_ids: Iterable[int]) -> None:
    """Tell every socket that may see them that these jobs changed. Call after commit; never raises.

    In-memory layer: rendered here and handed to the consumers' loop. Redis: the publisher thread renders and
    sends, and changes that arrive while it is busy are rendered together (each job once, in its newest state)."""
    try:
        layer = get_channel_layer()
        if layer is None:
            return
        if isinstance(layer, InMemoryChannelLayer):
            if _sockets_here():
                _dispatch(change_messages(render_rows(job_ids)))
            return
        _publisher().submit(layer, job_ids)
    except Exception:  # a broken channel layer must never fail a transition, a request or a scheduling pass
        log.exception("could not publish the change of jobs %s", job_ids)


# --- delivery -------------------------------------------------------------------------------------------------

_consumer_loop: asyncio.AbstractEventLoop | None = None


def register_consumer_loop() -> None:
    """Called by the consumers when a socket connects: the loop the in-memory layer's queues belong to."""
    global _consumer_loop
    _consumer_loop = asyncio.get_running_loop()


async def _send_all(layer: Any, sends: list[tuple[str, dict[str, Any]]]) -> None:
    for channel_group, message in sends:
        await layer.group_send(channel_group, message)


def _log_failure(future: Any) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("could not publish job changes: %r", future.exception())


def _sockets_here() -> bool:
    """Whether sockets of this process listen (the in-memory layer reaches no one else)."""
    loop = _consumer_loop
    return loop is not None and not loop.is_closed() and loop.is_running()


def _dispatch(sends: list[tuple[str, dict[str, Any]]]) -> None:
    """In-memory layer: send on the consumers' loop."""
    layer, loop = get_channel_layer(), _consumer_loop
    if layer is None or not _sockets_here():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        loop.create_task(_send_all(layer, sends)).add_done_callback(_log_failure)
    else:
        asyncio.run_coroutine_threadsafe(_send_all(layer, sends), loop).add_done_callback(_log_failure)


def _render_rows_and_close(ids: set[int]) -> list[dict[str, Any]]:
    from django.db import close_old_connections

    try:
        return render_rows(ids)
    finally:
        close_old_connections()


class _Publisher:
    """A daemon thread with an event loop that renders the changed jobs and sends them, one batch after another:
    the ids that arrive while a batch is out make the next batch (a job changed ten times meanwhile is read and
    rendered once, as it is now)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.ids: set[int] = set()
        self.layer: Any = None
        self.batches = self.rows = 0  # sent so far (the benchmark reports them)
        self.wakeup: asyncio.Event | None = None
        self.ready = threading.Event()
        self.idle = threading.Event()
        self.idle.set()
        self.lock = threading.Lock()
        # The database is read in a thread of its own (no event loop there, one connection).
        self.reader = ThreadPoolExecutor(1, thread_name_prefix="jobsite-publisher-db")
        self.resend = catchup.Resend(self)  # the changes it could not send go out again later
        self.thread = threading.Thread(target=self._run, name="jobsite-publisher", daemon=True)
        self.thread.start()
        self.ready.wait(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.wakeup = asyncio.Event()
        self.loop.call_soon(self.ready.set)
        self.loop.run_until_complete(self._worker())

    async def _worker(self) -> None:
        while True:
            await self.wakeup.wait()
            self.wakeup.clear()
            while True:
                with self.lock:
                    ids, self.ids, layer = self.ids, set(), self.layer
                    if not ids:
                        self.idle.set()
                        break
                try:
                    items = await self.loop.run_in_executor(self.reader, _render_rows_and_close, ids)
                except Exception as exc:  # the database: nothing to send again (a later change reads it afresh)
                    log.error("could not read the changed jobs %s: %r", sorted(ids), exc)
                    continue
                try:
                    await _send_all(layer, change_messages(items))
                    self.batches += 1
                    self.rows += len(items)
                    self.resend.sent()
                except Exception as exc:  # the channel layer: sent again later
                    log.error("could not publish job changes: %r (%s)", exc, self.resend.failed(ids))

    def submit(self, layer: Any, job_ids: Iterable[int]) -> None:
        with self.lock:
            self.ids.update(int(i) for i in job_ids)
            self.layer = layer
            self.idle.clear()
        self.loop.call_soon_threadsafe(self.wakeup.set)

    def flush(self, timeout: float) -> bool:
        return self.idle.wait(timeout)


_publisher_instance: _Publisher | None = None
_publisher_lock = threading.Lock()


def _publisher() -> _Publisher:
    global _publisher_instance
    with _publisher_lock:
        if _publisher_instance is None or _publisher_instance.pid != os.getpid():  # none yet, or forked
            _publisher_instance = _Publisher()
        return _publisher_instance


def flush(timeout: float = 5.0) -> bool:
    """Wait until the publisher thread has sent everything queued so far (for tests and at exit)."""
    publisher = _publisher_instance
    if publisher is None or publisher.pid != os.getpid():
        return True
    return publisher.flush(timeout)


atexit.register(flush, 2.0)


# --- the hub: one receiver per process, the sockets fed from memory ------------------------------------------


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
        self.joined: dict[str, int] = {}  # layer group → how many of the listened groups need it
        self.pending: dict[str, dict[int, dict[str, Any]]] = {}
        self.flush_handle: asyncio.TimerHandle | None = None
        self.tasks: list[asyncio.Task] = []
        self.lock = asyncio.Lock()
        self.matches: dict[tuple[str, frozenset[int]], asyncio.Future] = {}
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
                    await self._layer_join(_layer_group(name))
                members.add(consumer)
            await self._drop(consumer, keep=groups)

    async def leave(self, consumer: Any) -> None:
        async with self.lock:
            await self._drop(consumer, keep=set())
            if not self.listeners and self.channel is not None:
                for task in self.tasks:
                    task.cancel()
                self.tasks, self.channel = [], None
                if _hubs.get(self.loop) is self:
                    del _hubs[self.loop]

    async def _layer_join(self, name: str) -> None:
        self.joined[name] = self.joined.get(name, 0) + 1
        if self.joined[name] == 1:
            try:
                await self.layer.group_add(name, self.channel)
            except Exception as exc:  # the layer is away: joined again, and the sockets caught up, when it is back
                log.warning("could not join channel group %s: %r", name, exc)
                self.watch.lost()

    async def _drop(self, consumer: Any, keep: set[str]) -> None:
        for name in [n for n, members in self.listeners.items() if consumer in members and n not in keep]:
            self.listeners[name].discard(consumer)
            if self.listeners[name]:
                continue
            del self.listeners[name]
            layer_group = _layer_group(name)
            self.joined[layer_group] -= 1
            if self.joined[layer_group]:
                continue
            del self.joined[layer_group]
            try:
                await self.layer.group_discard(layer_group, self.channel)
            except Exception as exc:  # a disconnect must never fail; group_expiry ends the membership
                log.warning("could not leave channel group %s: %r", layer_group, exc)

    def groups(self) -> set[str]:
        """The layer groups this process listens to."""
        return set(self.joined)

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
            if message.get("type") != "jobs.changed" or group not in self.joined:
                continue
            bucket = self.pending.setdefault(group, {})
            for item in message.get("items", ()):
                old = bucket.get(item["id"])
                if old is None or item["at"] >= old["at"]:
                    bucket[item["id"]] = item
            if self.flush_handle is None:
                self.flush_handle = self.loop.call_later(FLUSH_SECONDS, self._flush)

    def _flush(self) -> None:
        self.flush_handle = None
        pending, self.pending = self.pending, {}
        self.matches = {}
        parts: dict[Any, list[dict[int, dict[str, Any]]]] = {}
        for name, members in self.listeners.items():
            if name.startswith(JOB_PREFIX):
                job_id = int(name[len(JOB_PREFIX):])
                item = pending.get(GROUP_ALL, {}).get(job_id)
                items = {job_id: item} if item else None
            else:
                items = pending.get(name)
            if items is None:
                continue
            for consumer in members:
                parts.setdefault(consumer, []).append(items)
        for consumer, found in parts.items():
            items = found[0] if len(found) == 1 else _newest(found)
            try:
                consumer.hub_push(items)
            except Exception:
                log.exception("live updates: a socket failed to take its update")

    async def matching(self, params: str, ids: frozenset[int]) -> set[int]:
        """The ids of ``ids`` that match the list filters ``params`` (a query string): one query per flush for all
        the sockets with the same filters."""
        from channels.db import database_sync_to_async

        key = (params, ids)
        future = self.matches.get(key)
        if future is None:
            future = self.matches[key] = asyncio.ensure_future(database_sync_to_async(matching_ids)(params, ids))
        return await asyncio.shield(future)


def _layer_group(name: str) -> str:
    return GROUP_ALL if name.startswith(JOB_PREFIX) else name


def _newest(found: list[dict[int, dict[str, Any]]]) -> dict[int, dict[str, Any]]:
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
