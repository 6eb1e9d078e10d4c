"""Celery tasks of production, and how the domain asks for notifications to be sent. Database work and outgoing
notifications only: the cluster is the scheduler process's alone.

``notifications_dispatch()`` is called after commit when a transition queued notifications. In production
(REDIS_URL) it sends ``notifications_send_task`` to the worker; the beat runs the same task periodically for what no
task took (a worker killed mid-send, Redis down at commit). The embedded default (``make run``: no Redis, no worker)
sends them from a thread of this process instead (JOBSITE_NOTIFY_INPROCESS), which also sweeps for retries.
"""

from __future__ import annotations

import logging
import threading

from celery import shared_task
from django.conf import settings
from django.db import close_old_connections, connections

from . import services
from .services.notifications import notifications_deliver_due

log = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def release_backoff_task() -> None:
    """BACKOFF jobs whose delay is over go back to PENDING (the scheduler's loop runs the same clock)."""
    services.jobs_release_backoff()


@shared_task(ignore_result=True)
def notifications_send_task() -> None:
    """Send every due notification: those a commit just queued, and (the beat's, periodically) what no task took
    and the retries whose backoff is over."""
    notifications_deliver_due()


class _InprocessSender:
    """The embedded default's worker: one daemon thread that sends when woken and sweeps every
    JOBSITE_NOTIFY_SWEEP_SECONDS (retries, and rows left by an earlier run). Started by the first dispatch."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stopping.clear()
                self._thread = threading.Thread(target=self._run, name="jobsite-notify", daemon=True)
                self._thread.start()
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """End the thread (after the send in progress, if any); the next dispatch starts another."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._stopping.set()
            self._wake.set()
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(settings.JOBSITE_NOTIFY_SWEEP_SECONDS)
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                close_old_connections()
                notifications_deliver_due()
            except Exception:
                log.exception("sending notifications failed; the next sweep tries again")
            finally:
                connections.close_all()


inprocess_sender = _InprocessSender()


def notifications_dispatch() -> None:
    """Ask for the queued notifications to be sent (after commit). Never raises: the sweep sends what a lost request
    missed."""
    if settings.JOBSITE_NOTIFY_INPROCESS:
        inprocess_sender.wake()
        return
    try:
        notifications_send_task.delay()
    except Exception:
        log.warning("could not queue the notification task; the periodic sweep will send them", exc_info=True)
