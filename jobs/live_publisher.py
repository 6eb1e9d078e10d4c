"""Publishing job changes: each change of a job is rendered once, as the row of the job list
(``jobs/_job_row.html``, the template the page itself is drawn from; a member of an array as its array's row,
``jobs/_array_row.html``), and sent after commit as one channel-layer message per audience.

Audiences (channel-layer groups):
  ``jobs.group.<group id>``  the rows of that job group's changed jobs (its members' list and queue pages)
  ``jobs.all``               every changed row (superusers' lists)
  ``jobs.job.<job id>``      that job's row, and its new GPU readings (its detail page, whoever opens it)
  ``jobs.utilisation``       "something changed", without rows (the utilisation page)

``publish_job_changes`` is called from the after-commit hooks of ``jobs.services``. It never raises into its caller:
with the layer down the change is logged and sent again later, and pages catch up when the layer is back
(``jobs.catchup``). With the in-memory layer (embedded default) the rows are rendered by the caller and handed to
the loop the consumers run on; with Redis a publisher thread renders and sends, so a caller in the scheduler never
waits, and first asks which audiences some web process listens to now (``jobs.live_audience``): a change no open
page shows is neither read nor rendered nor sent. Each web process's hub (``jobs.live_hub``) receives the messages
and hands them to its sockets.
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
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer

from . import catchup, channel_auth, live_audience
from .prepared import Prepared, in_parts

log = logging.getLogger(__name__)

GROUP_ALL = "jobs.all"
UTILISATION = "jobs.utilisation"
GROUP_PREFIX = "jobs.group."
JOB_PREFIX = "jobs.job."


def group_channel(group_id: int) -> str:
    return f"{GROUP_PREFIX}{group_id}"


def job_channel(job_id: int) -> str:
    """The audience of one job's page: a detail page open hears its job only, not every change of the site."""
    return f"{JOB_PREFIX}{job_id}"


# --- rendering: once per change, the row the list page draws -------------------------------------------------


# The job's columns the list row does not show (large JSON and text); reading one would cost a query per row.
ROW_UNUSED_FIELDS = ("command", "env", "array_params", "ports")


def _rows(ids):
    from .models import Job

    # The row never shows the large columns: not read, not decoded.
    return (Job.objects.filter(pk__in=ids).select_related("group", "user", "instance_type").order_by("id")
            .defer(*ROW_UNUSED_FIELDS))


ROWS = Prepared(_rows, ids=list)  # compiled once for each length of a batch


def render_rows(job_ids: Iterable[int], heard: set[str] | None = None) -> list[dict[str, Any]]:
    """One item per job: its list row rendered from ``jobs/_job_row.html`` (the template of the first load), its
    group and when it was rendered (the newest rendering of a job wins wherever two meet). One query (one for each
    IDS_A_STATEMENT jobs of a larger batch). ``heard``: the audiences listened to now (``jobs.live_audience``);
    only their jobs are rendered, and nothing is read when none of them shows rows (None: every job)."""
    from django.template.loader import get_template

    from . import selectors

    ids = sorted({int(i) for i in job_ids})
    shown, pages = _shown_groups(heard), _shown_jobs(heard)
    if shown is not None and not shown:  # no list open: the jobs whose own page is, if any
        ids = [i for i in ids if i in pages]
    if not ids:
        return []
    template = get_template("jobs/_job_row.html")
    jobs = in_parts(ids, lambda part: ROWS.all(ids=part))
    jobs = selectors.with_queue_positions([job for job in jobs
                                           if shown is None or job.group_id in shown or job.pk in pages])
    at = time.time()
    items = [{"id": job.pk, "group_id": job.group_id, "phase": job.phase, "at": at,
              "row": template.render({"job": job}).strip()} for job in jobs if not job.array_id]
    return items + _array_items({job.array_id for job in jobs if job.array_id}, at)


def _array_items(array_ids: set[int], at: float) -> list[dict[str, Any]]:
    """A changed member's array row (``jobs/_array_row.html``), keyed by its first member (the row's place in the
    list): each array once however many of its members changed."""
    if not array_ids:
        return []
    from django.template.loader import get_template

    from .list_arrays import array_rows
    from .models import Job

    template = get_template("jobs/_array_row.html")
    rows = array_rows(array_ids)
    firsts = Job.objects.select_related("instance_type").in_bulk([r.first_id for r in rows.values()])
    return [{"id": row.first_id, "group_id": row.array.group_id, "phase": firsts[row.first_id].phase, "at": at,
             "row": template.render({"row": row, "job": firsts[row.first_id]}).strip()}
            for row in rows.values() if row.first_id in firsts]


def _shown_groups(heard: set[str] | None) -> set[int] | None:
    """The job groups whose rows some page shows, of the audiences ``heard`` (None: all of them)."""
    if heard is None or GROUP_ALL in heard:
        return None
    return _ids_heard(heard, GROUP_PREFIX)


def _shown_jobs(heard: set[str] | None) -> set[int]:
    """The jobs whose own page (``job_channel``) is open, of the audiences ``heard``."""
    return _ids_heard(heard or (), JOB_PREFIX)


def _ids_heard(heard: Iterable[str], prefix: str) -> set[int]:
    ids = (name.removeprefix(prefix) for name in heard if name.startswith(prefix))
    return {int(i) for i in ids if i.isdigit()}


def change_messages(items: list[dict[str, Any]], heard: set[str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """One ``jobs.changed`` message per audience: each job group with its jobs' rows, superusers with all of them,
    each job's own page with its row, and the utilisation page (no rows: "something changed"); only to the
    audiences ``heard`` (None: to all)."""
    by_group: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        by_group.setdefault(group_channel(item["group_id"]), []).append(item)
    sends = [(name, rows) for name, rows in by_group.items()] + ([(GROUP_ALL, items)] if items else [])
    sends += [(job_channel(item["id"]), [item]) for item in items]
    sends.append((UTILISATION, []))
    sends = _heard_only(sends, heard)
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


GPUS_CHANGED = "jobs.gpus"


def publish_gpu_changes(job_ids: Iterable[int]) -> None:
    """Tell the detail pages of these jobs that new GPU readings were stored: one small message (its id, no row) to
    each job's page for the sampling round; each page draws its chart itself (``jobs.live_detail``). Never raises."""
    try:
        layer = get_channel_layer()
        if layer is None:
            return
        at = time.time()
        sends = [(job_channel(i), channel_auth.sign({"type": GPUS_CHANGED, "group": job_channel(i),
                                                     "items": [{"id": i, "at": at}]}))
                 for i in sorted({int(i) for i in job_ids})]
        if isinstance(layer, InMemoryChannelLayer):
            _dispatch(sends)
            return
        publisher = _publisher()
        future = asyncio.run_coroutine_threadsafe(publisher.send_heard(layer, sends), publisher.loop)
        future.add_done_callback(_log_failure)
    except Exception:  # as publish_job_changes: never into the caller
        log.exception("could not publish the GPU readings of jobs %s", job_ids)


# --- delivery -------------------------------------------------------------------------------------------------

_consumer_loop: asyncio.AbstractEventLoop | None = None


def register_consumer_loop() -> None:
    """Called by the consumers when a socket connects: the loop the in-memory layer's queues belong to."""
    global _consumer_loop
    _consumer_loop = asyncio.get_running_loop()


def _heard_only(sends: list[tuple[str, Any]], heard: set[str] | None) -> list[tuple[str, Any]]:
    """The sends to the audiences ``heard`` (None: all of them)."""
    return sends if heard is None else [(name, what) for name, what in sends if name in heard]


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


def _render_rows_and_close(ids: set[int], heard: set[str] | None) -> list[dict[str, Any]]:
    from django.db import close_old_connections

    try:
        return render_rows(ids, heard)
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
        self.unheard = 0  # changed jobs left alone: no page anywhere listened
        self._audience: live_audience.Audience | None = None
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
                    heard = await self._heard(layer)
                except Exception as exc:  # the channel layer: sent again later
                    log.error("could not publish job changes: %r (%s)", exc, self.resend.failed(ids))
                    continue
                if heard is not None and not heard:  # no page anywhere: nothing to read, render or send
                    self.unheard += len(ids)
                    continue
                try:
                    items = await self.loop.run_in_executor(self.reader, _render_rows_and_close, ids, heard)
                except Exception as exc:  # the database: nothing to send again (a later change reads it afresh)
                    log.error("could not read the changed jobs %s: %r", sorted(ids), exc)
                    continue
                try:
                    await _send_all(layer, change_messages(items, heard))
                    self.batches += 1
                    self.rows += len(items)
                    self.resend.sent()
                except Exception as exc:  # the channel layer: sent again later
                    log.error("could not publish job changes: %r (%s)", exc, self.resend.failed(ids))

    async def send_heard(self, layer: Any, sends: list[tuple[str, dict[str, Any]]]) -> None:
        """Send to the audiences of ``sends`` some page listens to now (a sampling round's GPU readings: one
        message a running job, most of whose pages are not open)."""
        heard = await self._heard(layer)
        await _send_all(layer, _heard_only(sends, heard))

    async def _heard(self, layer: Any) -> set[str] | None:
        """The audiences some page listens to now (``live_audience``), asked of ``layer``'s Redis."""
        if self._audience is None or self._audience.layer is not layer:  # the first, or the settings changed
            if self._audience is not None:
                await self._audience.close()
            self._audience = live_audience.Audience(layer)
        return await self._audience.groups()

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
