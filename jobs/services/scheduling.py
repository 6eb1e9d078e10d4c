"""What the scheduler does to jobs: admit a queued job (a new attempt), preempt a running one, retry or fail one
whose attempt failed, and release the jobs whose backoff is over.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import rules
from ..choices import JobType, Phase
from ..models import Attempt, Job
from ..prepared import Prepared
from ..prepared_writes import insert
from ..state_machine import InvalidTransition
from .events import event_record
from .transitions import job_terminate, job_transition

LAST_ATTEMPT_NUMBER = Prepared(lambda job: Attempt.objects.filter(job_id=job).order_by("-number")
                               .values_list("number", flat=True)[:1], job=int)


@transaction.atomic
def job_admit(*, job: Job, backend: str, placement: list[dict[str, Any]], over_quota: bool = False,
              nominated: bool = False, now: datetime | None = None, locked: bool = False) -> Attempt:
    """Admit a queued job: a new attempt in PREPARING holding its resources. Launching happens after commit.
    ``InvalidTransition``, nothing written (the attempt rolled back with the rest), when the job is no longer PENDING
    (cancelled since it was decided on). ``locked``: ``job`` is as the caller's transaction locked it
    (``job_transition``'s), and is not read again."""
    now = now or timezone.now()
    number = (next(iter(LAST_ATTEMPT_NUMBER.all(job=job.pk)), None) or 0) + 1
    attempt = insert(Attempt(
        job=job,
        number=number,
        replicas=job.replicas,
        gpu=job.gpu,
        backend=backend,
        node=",".join(sorted({p["node"] for p in placement})),
        placement={str(rank): p for rank, p in enumerate(placement)},
        started_at=now,
    ))
    message = f"Attempt {number} admitted" + (f" on {attempt.node}" if attempt.node else "")
    if over_quota:
        message += ", over its group's quota on idle resources: first to be preempted"
    if nominated:
        message += ", on the resources freed by the jobs it preempted"
    job_transition(job=job, phase=Phase.PREPARING, reason="Admitted", event_reason="Admitted", message=message,
                   current_attempt=attempt, admitted_at=now, exit_code=None, over_quota=over_quota, retry_at=None,
                   now=now, from_phases=(Phase.PENDING,), locked=locked)
    return attempt


# Why an attempt failed by its own exit, counted against the backoff limit: its command's code (Error), or the kernel
# killing it over its memory (OOMKilled, exit 137), as a Kubernetes Job counts both.
EXIT_FAILURES = ("Error", "OOMKilled")


def job_retry_or_fail(*, job: Job, exit_code: int | None, reason: str, message: str,
                      now: datetime | None = None) -> Job:
    """An attempt failed: back off and retry while the backoff limit allows, else FAILED."""
    now = now or timezone.now()
    # Earlier attempts that failed by their own exit, plus this one (whose outcome is written below).
    failures = job.attempts.filter(outcome__in=EXIT_FAILURES).exclude(pk=job.current_attempt_id).count() + 1
    if job.job_type == JobType.TRAINING and failures <= job.backoff_limit and reason in EXIT_FAILURES:
        delay = rules.retry_delay(failures)
        return job_transition(
            job=job, phase=Phase.BACKOFF, status="Error", reason=reason, exit_code=exit_code, now=now,
            message=f"{message}; retry {failures}/{job.backoff_limit} in {delay} s",
            retry_at=now + timedelta(seconds=delay),
        )
    if job.job_type == JobType.TRAINING and reason in EXIT_FAILURES and job.backoff_limit:
        message += f"; no retries left (backoff limit {job.backoff_limit})"
    return job_transition(job=job, phase=Phase.FAILED, status="Fail", reason=reason, message=message,
                          exit_code=exit_code, now=now)


# Read by every sync round, nearly always to find none.
BACKOFF_OVER = Prepared(lambda now: Job.objects.filter(phase=Phase.BACKOFF, retry_at__lte=now), now=datetime)


def jobs_release_backoff(*, now: datetime | None = None) -> int:
    """Move the BACKOFF jobs whose delay is over back to PENDING (a clock: the scheduler loop and Celery beat both
    call it; each job changes under its row lock, so twice is harmless). Returns how many moved."""
    now = now or timezone.now()
    moved = 0
    for job in BACKOFF_OVER.all(now=now):
        try:  # job_transition is atomic itself: a refused move rolls back alone
            job_transition(job=job, phase=Phase.PENDING, reason="Retrying", now=now,
                           message=f"Retrying after {job.message}", retry_at=None)
            moved += 1
        except InvalidTransition:
            continue
    return moved

def job_preempt(*, job: Job, by_job_id: int, message: str, now: datetime | None = None) -> Job:
    """Evict a running preemptible job for ``by_job_id``: a training job comes back PENDING (keeping its place
    in the queue, a new attempt, no backoff spent); an interactive one ends PREEMPTED."""
    target = Phase.PENDING if job.job_type == JobType.TRAINING else Phase.PREEMPTED
    job = job_terminate(job=job, target=target, reason="Preempted", message=message, now=now)
    by = Job.objects.filter(pk=by_job_id).first()
    if by:
        event_record(job=by, reason="Preempting", message=f"Preempting job #{job.pk} ({job.name})")
    return job
