"""The scheduler loop: a pass, a sync of active jobs and housekeeping, every interval or when woken.

The embedded default runs it as a thread of the web process (``manage.py serve``); ``manage.py runscheduler``
runs it in the foreground.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import close_old_connections

from .backends import get_backend
from .passes import schedule_pass
from .sync import housekeeping, sync_jobs
from .triggers import wakeup_event

log = logging.getLogger(__name__)


def tick() -> None:
    backend = get_backend()
    schedule_pass(backend=backend)
    sync_jobs(backend=backend)
    housekeeping(backend=backend)


class SchedulerLoop(threading.Thread):
    def __init__(self, interval: float | None = None):
        super().__init__(name="jobsite-scheduler", daemon=True)
        self.interval = interval or settings.JOBSITE_SCHEDULER_INTERVAL
        self.stopping = threading.Event()

    def run(self) -> None:
        log.info("scheduler loop started (backend %s, every %.1f s)", settings.JOBSITE_BACKEND, self.interval)
        backend = get_backend()
        getattr(backend, "start", lambda: None)()  # e.g. the Kubernetes watch, only in the scheduler process
        wake = wakeup_event()
        while not self.stopping.is_set():
            wake.clear()
            try:
                close_old_connections()
                tick()
            except Exception:  # one bad round must not stop scheduling
                log.exception("scheduler round failed")
            wake.wait(self.interval)

    def stop(self) -> None:
        self.stopping.set()
        wakeup_event().set()
        getattr(get_backend(), "close", lambda: None)()
