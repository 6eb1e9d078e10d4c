"""Live push: small per-job messages on Channels groups, sent after commit (never the whole list).

Channel groups:
  ``jobs.group.<group id>``  every change of a job of that job group (members subscribe, checked at connect)
  ``jobs.all``               every change (superusers)
  ``jobs.job.<job id>``      one job's changes (its detail page)
  ``jobs.utilisation``       "something changed" pings without job data (the utilisation page)

``publish_job_changes`` is called from the after-commit hooks of ``jobs.services``: it reads the changed jobs in
one query and hands the messages to the channel layer. It never raises into its caller: with the layer down the
change is logged and browsers catch up when they reconnect.

Sending is asynchronous and in order. With the in-memory layer (embedded default) the messages are handed to the
event loop the WebSocket consumers of this process run on (the layer's queues belong to that loop); with any
other layer (Redis) a publisher thread with its own event loop sends them one batch after another, so a caller
in the scheduler never waits for Redis.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.utils import timezone

from .choices import Phase
from .state_machine import color_for, color_name

log = logging.getLogger(__name__)

GROUP_ALL = "jobs.all"
UTILISATION = "jobs.utilisation"

MESSAGE_FIELDS = (
    "id", "name", "group_id", "group__name", "user__username", "instance_type__name", "replicas", "gpu",
    "phase", "status", "reason", "message", "queue_position", "over_quota", "exit_code", "job_type",
    "created_at", "updated_at", "admitted_at", "started_at", "finished_at", "current_attempt__number",
    "estimated_start", "estimate_basis",
)


def group_channel(group_id: int) -> str:
    return f"jobs.group.{group_id}"


def job_channel(job_id: int) -> str:
    return f"jobs.job.{job_id}"


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
    """What a pending job shows of its estimated start: "est. start 14:20 (by history)", the date too when it is
    not today (in the site's time zone), or "est. start not within 30 days"; empty for any other job."""
    if phase != Phase.PENDING:
        return ""
    if start is None:
        return "est. start not within 30 days" if position else ""
    local = timezone.localtime(start)
    shown = f"{local:%H:%M}" if local.date() == timezone.localdate() else f"{local:%Y-%m-%d %H:%M}"
    return f"est. start {shown} (by {basis or 'deadlines'})"


def job_messages(job_ids: Iterable[int]) -> list[tuple[int, dict[str, Any]]]:
    """(group id, message) of each job, read in one query."""
    from .models import Job

    ids = sorted({int(i) for i in job_ids})
    if not ids:
        return []
    rows = Job.objects.filter(pk__in=ids).order_by("id").values(*MESSAGE_FIELDS)
    return [(row["group_id"], job_message(row)) for row in rows]


def publish_job_changes(job_ids: Iterable[int]) -> None:
    """Tell every socket that may see them that these jobs changed. Call after commit; never raises."""
    try:
        messages = job_messages(job_ids)
        if not messages:
            return
        sends: list[tuple[str, dict[str, Any]]] = []
        for group_id, message in messages:
            for channel_group in (group_channel(group_id), GROUP_ALL, job_channel(message["id"])):
                sends.append((channel_group, message))
        sends.append((UTILISATION, {"type": "utilisation.changed"}))
        _dispatch(sends)
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


def _dispatch(sends: list[tuple[str, dict[str, Any]]]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    if isinstance(layer, InMemoryChannelLayer):
        loop = _consumer_loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return  # no socket ever connected to this process: nobody to tell
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.create_task(_send_all(layer, sends)).add_done_callback(_log_failure)
        else:
            asyncio.run_coroutine_threadsafe(_send_all(layer, sends), loop).add_done_callback(_log_failure)
        return
    _publisher().submit(layer, sends)


class _Publisher:
    """A daemon thread with an event loop that sends batches to the channel layer one after another."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.queue: asyncio.Queue | None = None
        self.ready = threading.Event()
        self.idle = threading.Event()
        self.idle.set()
        self.pending = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="jobsite-publisher", daemon=True)
        self.thread.start()
        self.ready.wait(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.queue = asyncio.Queue()
        self.loop.call_soon(self.ready.set)
        self.loop.run_until_complete(self._worker())

    async def _worker(self) -> None:
        while True:
            layer, sends = await self.queue.get()
            try:
                await _send_all(layer, sends)
            except Exception as exc:
                log.error("could not publish job changes: %r", exc)
            finally:
                with self.lock:
                    self.pending -= 1
                    if not self.pending:
                        self.idle.set()

    def submit(self, layer: Any, sends: list[tuple[str, dict[str, Any]]]) -> None:
        with self.lock:
            self.pending += 1
            self.idle.clear()
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (layer, sends))

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
