"""How the rest of the code asks the scheduler for work, after commit.

Embedded default ("inprocess"): wake the loop thread of this process. Production ("celery"): queue a task.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings

log = logging.getLogger(__name__)

_wakeup = threading.Event()


def wakeup_event() -> threading.Event:
    return _wakeup


def request_pass() -> None:
    if settings.JOBSITE_SCHEDULER_MODE == "celery":
        from scheduler.tasks import schedule_pass_task

        try:
            schedule_pass_task.delay()
        except Exception:  # the periodic pass catches up; a broker hiccup must not fail a user's request
            log.exception("could not queue a scheduling pass")
    else:
        _wakeup.set()


def stop_attempt(attempt_id: int | None, *, force: bool = False) -> None:
    if attempt_id is None:
        return
    from scheduler.passes import attempt_stop

    try:
        attempt_stop(attempt_id, force=force)
    except Exception:  # the sync loop retries the stop while the job is TERMINATING
        log.exception("could not stop attempt %s", attempt_id)
