"""How the domain asks the scheduler for a pass, without importing it.

``request_pass()`` is called after commit (a submit, a finish, an admin change). It wakes the scheduler loop of this
process (the embedded default runs it as a thread) and, when the scheduler is its own process on PostgreSQL
(JOBSITE_SCHEDULER_MODE=process), sends a ``NOTIFY`` on ``CHANNEL`` that the scheduler listens to. It never raises:
the scheduler's periodic pass catches up with anything a lost wake-up missed.

A wake-up asks for an admission pass and a sync round (the backend's pods and processes looked at: what a stop
needs), or, with ``sync=False``, for the pass alone (``ADMISSION_ONLY``, the NOTIFY's payload): a burst of submits
wakes admission only, never a sync round per submit.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import connection

log = logging.getLogger(__name__)

CHANNEL = "jobsite_scheduler"
ADMISSION_ONLY = "admission"

_wakeup = threading.Event()
_sync_wanted = threading.Event()


def wakeup_event() -> threading.Event:
    return _wakeup


def wake_here(*, sync: bool = True) -> None:
    """Wake this process's scheduler loop: the flag before the event, so the loop, which clears the event before
    it reads the flag, never misses a sync asked for."""
    if sync:
        _sync_wanted.set()
    _wakeup.set()


def sync_requested() -> bool:
    """Whether a wake-up since the last call asked for a sync round (read once: it is cleared)."""
    if _sync_wanted.is_set():
        _sync_wanted.clear()
        return True
    return False


def request_pass(*, sync: bool = True) -> None:
    wake_here(sync=sync)
    if settings.JOBSITE_SCHEDULER_MODE != "process" or connection.vendor != "postgresql":
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {CHANNEL}" if sync else f"NOTIFY {CHANNEL}, '{ADMISSION_ONLY}'")
    except Exception:
        log.exception("could not notify the scheduler")


def request_admission() -> None:
    """``request_pass(sync=False)``: for ``transaction.on_commit`` after a submit."""
    request_pass(sync=False)
