"""How the domain asks the scheduler for a pass, without importing it.

``request_pass()`` is called after commit (a submit, a finish, an admin change). It wakes the scheduler loop of this
process (the embedded default runs it as a thread) and, when the scheduler is its own process on PostgreSQL
(JOBSITE_SCHEDULER_MODE=process), sends a ``NOTIFY`` on ``CHANNEL`` that the scheduler listens to. It never raises:
the scheduler's periodic pass catches up with anything a lost wake-up missed.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import connection

log = logging.getLogger(__name__)

CHANNEL = "jobsite_scheduler"

_wakeup = threading.Event()


def wakeup_event() -> threading.Event:
    return _wakeup


def request_pass() -> None:
    _wakeup.set()
    if settings.JOBSITE_SCHEDULER_MODE != "process" or connection.vendor != "postgresql":
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"NOTIFY {CHANNEL}")
    except Exception:
        log.exception("could not notify the scheduler")
