"""What a user does to a job: cancel or stop it (one job, or many at once with a result per job) and restart it."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from ..choices import RESOURCE_PHASES, TERMINAL_PHASES, JobType, Phase
from ..models import Job
from ..state_machine import InvalidTransition
from .transitions import job_terminate, job_transition, terminated_status

log = logging.getLogger(__name__)


@transaction.atomic
def job_cancel(*, job: Job, by: AbstractBaseUser, stop: bool = False) -> Job:
    """Cancel from any non-terminal phase: queued jobs end at once, running ones go through TERMINATING.

    ``stop`` is the restartable cancel (status Stopped); an interactive job closed by its user ends Deleted.
    """
    job = Job.objects.select_for_update().get(pk=job.pk)
    who = by.get_username()
    if job.phase in TERMINAL_PHASES:
        raise ValidationError(f"Job #{job.pk} has already ended ({job.get_phase_display()}).")
    if stop:
        reason, message = "StoppedByUser", f"Stopped by {who}; restart it to run again"
    elif job.job_type == JobType.INTERACTIVE:
        reason, message = "DeletedByUser", f"Closed by {who}"
    else:
        reason, message = "CancelledByUser", f"Cancelled by {who}"
    if job.phase == Phase.TERMINATING:
        # Being preempted, or a failed attempt being stopped before its retry: end it instead.
        if job.termination_target in (Phase.PENDING, Phase.PREEMPTED, Phase.BACKOFF):
            return job_transition(job=job, phase=Phase.TERMINATING, reason=reason, message=message,
                                  termination_target=Phase.CANCELLED)
        return job
    if job.phase in RESOURCE_PHASES:
        return job_terminate(job=job, target=Phase.CANCELLED, reason=reason, message=message)
    return job_transition(job=job, phase=Phase.CANCELLED, status=terminated_status(Phase.CANCELLED, reason),
                          reason=reason, message=message)


@transaction.atomic
def job_restart(*, job: Job, by: AbstractBaseUser) -> Job:
    """Run an ended job again from the beginning, as a new attempt of the same job (back into its queue)."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.phase not in TERMINAL_PHASES:
        raise ValidationError(f"Job #{job.pk} is still {job.get_phase_display().lower()}; stop it first.")
    if job.phase == Phase.SUCCEEDED:
        raise ValidationError(f"Job #{job.pk} has succeeded; clone it to run it again.")
    return job_transition(job=job, phase=Phase.PENDING, reason="Restarted", retry_at=None,
                          message=f"Restarted by {by.get_username()}", queued_at=timezone.now())


CANNOT_ACT = "You can act only on your own jobs and on the jobs of groups you administer."


def job_cancel_many(*, ids: Iterable[int], by: AbstractBaseUser, stop: bool = False) -> list[dict[str, Any]]:
    """Cancel (or stop) each job on its own, in its own transaction, in the order given (repeats once). Per id:
    ``{id, ok, status_code, detail, phase, status}``, ``status_code`` being what acting on that job alone would
    have answered: 404 not visible to ``by``, 403 not theirs to act on, 400 refused (e.g. ended already), 409
    changed meanwhile, 500 failed (logged; the others are still tried)."""
    from .. import selectors

    ids = list(dict.fromkeys(int(i) for i in ids))
    visible = {job.pk: job for job in selectors.jobs_visible_to(by).filter(pk__in=ids)}

    def result(pk: int, code: int, detail: str, job: Job | None = None) -> dict[str, Any]:
        return {"id": pk, "ok": code == 200, "status_code": code, "detail": detail,
                "phase": job.phase if job else None, "status": job.status if job else None}

    results = []
    for pk in ids:
        job = visible.get(pk)
        if job is None:
            results.append(result(pk, 404, "No such job."))
            continue
        if not selectors.job_can_act(by, job):
            results.append(result(pk, 403, CANNOT_ACT, job))
            continue
        try:
            with transaction.atomic():
                job = job_cancel(job=job, by=by, stop=stop)
        except ValidationError as exc:
            job.refresh_from_db()
            results.append(result(pk, 400, " ".join(exc.messages), job))
        except InvalidTransition as exc:
            job.refresh_from_db()
            results.append(result(pk, 409, f"The job changed meanwhile ({exc}); reload it and try again.", job))
        except Exception:  # one job's failure must not lose the report of the others
            log.exception("cancelling job %s (of several) failed", pk)
            results.append(result(pk, 500, "Could not cancel this job; try again.", None))
        else:
            results.append(result(pk, 200, "Stopped." if stop else "Cancelled.", job))
    return results
