"""Keep each job true to its processes/pods, and the time-based housekeeping.

``sync_jobs`` reads every active attempt back from its backend (so a restart of the web server loses
nothing) and turns what it sees into transitions. ``housekeeping`` runs the clocks: backoff retries, TTL.
Both are plain functions: the embedded loop and Celery beat call the same code.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs import services
from jobs.choices import RESOURCE_PHASES, TERMINAL_PHASES, JobType, Phase
from jobs.models import Attempt, Job
from jobs.state_machine import InvalidTransition

from .backends import get_backend
from .backends.base import Backend, ReplicaObservation, ReplicaState
from .passes import attempt_launch, relaunch_attempt

log = logging.getLogger(__name__)


def sync_jobs(*, backend: Backend | None = None, now: datetime | None = None) -> int:
    backend = backend or get_backend()
    jobs = Job.objects.filter(phase__in=RESOURCE_PHASES, current_attempt__backend=backend.name).select_related(
        "current_attempt"
    )
    count = 0
    for job in jobs:
        try:
            sync_job(job, backend=backend, now=now or timezone.now())
            count += 1
        except InvalidTransition:  # changed by someone else since we read it; next round sees the new state
            continue
        except Exception:
            log.exception("syncing job %s failed", job.pk)
    return count


def sync_job(job: Job, *, backend: Backend, now: datetime) -> None:
    attempt = job.current_attempt
    if attempt.launched_at is None:
        attempt_launch(job.pk, backend=backend)  # admitted but never launched (e.g. the server stopped)
        return
    seen = backend.observe(job_id=job.pk, attempt_number=attempt.number, replicas=attempt.replicas)
    states = {o.state for o in seen}
    ended = [o for o in seen if o.state in (ReplicaState.EXITED, ReplicaState.LOST)]
    failed = [o for o in seen if o.state == ReplicaState.EXITED and o.exit_code != 0]

    if job.phase == Phase.TERMINATING:
        if len(ended) == len(seen):
            with transaction.atomic():
                _finish_termination(job, seen, now)
        elif job.terminating_since and now - job.terminating_since > timedelta(
            seconds=settings.JOBSITE_TERMINATION_GRACE_SECONDS
        ):  # the grace period is over: SIGKILL / force delete (no write, so nothing to wait for)
            backend.stop(job_id=job.pk, attempt_number=attempt.number, replicas=attempt.replicas, force=True)
        return

    with transaction.atomic():

        if ReplicaState.LOST in states:
            _lost(job, [o for o in seen if o.state == ReplicaState.LOST], backend, now)
            return
        broken = next((o for o in seen if o.state == ReplicaState.FAILED), None)
        if broken:  # cannot run at all (bad image, ...): stop the rest, no retry
            services.job_terminate(job=job, target=Phase.FAILED, reason=broken.reason or "ContainerCannotRun",
                                   message=broken.message or broken.status, now=now)
            return
        if job.job_type == JobType.INTERACTIVE and len(ended) == len(seen):
            _restart_in_place(job, seen, backend, now)
            return
        if len(ended) == len(seen):
            if failed:
                first = failed[0]
                services.job_retry_or_fail(job=job, exit_code=first.exit_code, reason="Error", now=now,
                                           message=_exit_message(first, len(seen)))
            else:
                services.job_transition(job=job, phase=Phase.SUCCEEDED, reason="Completed", exit_code=0, now=now,
                                        message="All replicas exited with code 0" if len(seen) > 1 else
                                        "Exited with code 0")
            return
        if failed and job.job_type == JobType.TRAINING:  # one replica failed, others run: the attempt failed
            services.job_terminate(job=job, target=Phase.FAILED, reason="Error", now=now,
                                   message=_exit_message(failed[0], len(seen)) + "; stopping the other replicas")
            return
        deadline = job.admitted_at and job.admitted_at + timedelta(seconds=job.active_deadline_seconds)
        if deadline and now >= deadline:
            services.job_terminate(job=job, target=Phase.TIMED_OUT, reason="DeadlineExceeded", now=now,
                                   message=f"Ran past its deadline of {job.active_deadline_seconds} s")
            return
        if states == {ReplicaState.RUNNING} and job.phase in (Phase.PREPARING, Phase.UNKNOWN):
            services.job_transition(job=job, phase=Phase.RUNNING, reason="", now=now,
                                    message=f"{len(seen)} replica(s) running" + (
                                        f" on {attempt.node}" if attempt.node else ""))
            return
        stuck_for = now - (attempt.started_at or now)
        if job.phase == Phase.PREPARING and stuck_for > timedelta(seconds=settings.JOBSITE_PREPARING_TIMEOUT_SECONDS):
            _requeue(job, int(stuck_for.total_seconds()), now)
            return
        # Same phase, finer status from the backend (ErrImagePull, Init:1/2, CrashLoopBackOff, ...).
        shown = next((o for o in seen if o.status), None)
        if shown and shown.status != job.status:
            services.job_transition(job=job, phase=job.phase, status=shown.status, reason=shown.reason,
                                    message=shown.message, now=now)


def _exit_message(o: ReplicaObservation, replicas: int) -> str:
    who = f"Replica {o.rank}" if replicas > 1 else "The command"
    return f"{who} exited with code {o.exit_code}" + (f" ({o.status})" if o.status else "")


def _requeue(job: Job, stuck_seconds: int, now: datetime) -> None:
    """An attempt still preparing after the timeout: delete it and queue the job again, with a growing delay."""
    requeues = job.attempts.filter(outcome="Requeued").count()
    if requeues >= settings.JOBSITE_REQUEUE_LIMIT:
        services.job_terminate(job=job, target=Phase.FAILED, reason="RequeueLimitExceeded", now=now, message=(
            f"Still preparing after {stuck_seconds} s, after {requeues} requeue(s): giving up"))
        return
    delay = min(60 * 2**requeues, 3600)
    services.job_terminate(job=job, target=Phase.PENDING, reason="Requeued", now=now, message=(
        f"Still preparing after {stuck_seconds} s: requeued ({requeues + 1}/{settings.JOBSITE_REQUEUE_LIMIT}), "
        f"eligible again in {delay} s"), retry_at=now + timedelta(seconds=delay))


def _restart_in_place(job: Job, seen: list[ReplicaObservation], backend: Backend, now: datetime) -> None:
    """Interactive jobs never end by themselves: their replicas restart, with a growing delay (CrashLoopBackOff)."""
    attempt = job.current_attempt
    if job.status == "CrashLoopBackOff" and job.retry_at and job.retry_at > now:
        return  # waiting out the delay
    if job.status == "CrashLoopBackOff" and job.retry_at:
        transaction.on_commit(lambda: relaunch_attempt(job, attempt, backend))  # processes only once it holds
        services.job_transition(job=job, phase=Phase.RUNNING, reason="Restarted", retry_at=None, now=now,
                                message=f"Restarted in place (restart #{attempt.backend_data.get('restarts', 0)})")
        return
    restarts = services.attempt_count_restart(attempt=attempt)
    delay = min(10 * 2 ** (restarts - 1), 300)
    worst = next((o for o in seen if o.exit_code), seen[0])
    services.job_transition(
        job=job, phase=Phase.RUNNING, status="CrashLoopBackOff", reason="CrashLoopBackOff", now=now,
        exit_code=worst.exit_code, retry_at=now + timedelta(seconds=delay),
        message=f"{_exit_message(worst, len(seen))}; restart #{restarts} in {delay} s",
    )


def _finish_termination(job: Job, seen: list[ReplicaObservation], now: datetime) -> None:
    target = job.termination_target or Phase.CANCELLED
    codes = [o.exit_code for o in seen if o.exit_code is not None]
    exit_code = next((c for c in codes if c != 0), codes[0] if codes else None)
    services.job_transition(job=job, phase=target, status=services.terminated_status(target, job.reason),
                            reason=job.reason, message=job.message, exit_code=exit_code, now=now,
                            event_reason="Terminated")


def _lost(job: Job, lost: list[ReplicaObservation], backend: Backend, now: datetime) -> None:
    message = "; ".join(o.message for o in lost)
    if job.phase != Phase.UNKNOWN:
        services.job_transition(job=job, phase=Phase.UNKNOWN, reason="NodeUnresponsive", message=message, now=now)
        return
    since = job.updated_at or now
    if now - since >= timedelta(seconds=settings.JOBSITE_NODE_LOST_GRACE_SECONDS):
        attempt = job.current_attempt
        transaction.on_commit(lambda: backend.stop(job_id=job.pk, attempt_number=attempt.number,
                                                   replicas=attempt.replicas, force=True))
        # Lost through no fault of the job: retried without spending its backoff.
        services.job_transition(job=job, phase=Phase.PENDING, reason="NodeLost", now=now,
                                message=f"{message}; attempt {attempt.number} failed as NodeLost, requeued")


def housekeeping(*, backend: Backend | None = None, now: datetime | None = None) -> None:
    """Clocks: move BACKOFF jobs whose delay is over back to PENDING; delete working dirs after their TTL."""
    backend = backend or get_backend()
    now = now or timezone.now()
    for job in Job.objects.filter(phase=Phase.BACKOFF, retry_at__lte=now):
        try:
            with transaction.atomic():
                services.job_transition(job=job, phase=Phase.PENDING, reason="Retrying", now=now,
                                        message=f"Retrying after {job.message}", retry_at=None)
        except InvalidTransition:
            continue
    due = Job.objects.filter(cleaned_at__isnull=True, expires_at__lte=now, phase__in=TERMINAL_PHASES)
    cleanup = getattr(backend, "cleanup", None)
    for job_id in due.values_list("id", flat=True)[:500]:
        if cleanup:
            for number, replicas in Attempt.objects.filter(job_id=job_id, backend=backend.name).values_list(
                "number", "replicas"
            ):
                cleanup(job_id=job_id, attempt_number=number, replicas=replicas)
        services.job_mark_cleaned(job_id=job_id, now=now)
