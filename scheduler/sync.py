"""Keep each job true to its processes/pods, and the time-based housekeeping.

``sync_jobs`` reads every active attempt back from its backend (so a restart loses nothing), records the events
the backend saw (``backend_events``), asks the pure ``reconcile`` what the observations mean, and applies its
actions: transitions through ``jobs.services`` in one transaction per job, then the backend calls (stop, launch,
relaunch) through the actuator after commit, never inside the transaction. ``housekeeping`` runs the clocks:
backoff retries, TTL. ``orphans_delete`` has the backend delete what belongs to no live attempt. Plain functions:
the scheduler loop (the embedded thread or ``manage.py runscheduler``) calls them.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F
from django.utils import timezone

from jobs import services
from jobs.choices import RESOURCE_PHASES, TERMINAL_PHASES, EventType, Phase
from jobs.models import Attempt, Job
from jobs.prepared import Prepared
from jobs.services.backend_records import STARTED_OF
from jobs.state_machine import InvalidTransition

from .actuator import Actuator, get_actuator
from .backend_events import backend_events_record
from .backend_factory import get_backend
from .backends.base import Backend
from .reconcile import (
    DISRUPTED,
    Action,
    CountRestart,
    FinishTermination,
    JobView,
    Launch,
    RecordStarted,
    Relaunch,
    RetryOrFail,
    Stop,
    Terminate,
    Timing,
    Transition,
    reconcile,
)
from .values import ReplicaObservation

log = logging.getLogger(__name__)

DISRUPTION_OUTCOMES = (DISRUPTED, "NodeLost")  # attempts the cluster ended through no fault of the job


def timing_for(backend: Backend) -> Timing:
    return Timing(
        preparing_timeout=settings.JOBSITE_PREPARING_TIMEOUT_SECONDS,
        node_lost_grace=settings.JOBSITE_NODE_LOST_GRACE_SECONDS,
        requeue_limit=settings.JOBSITE_REQUEUE_LIMIT,
        stuck_after=backend.stuck_after(),
        start_timeout=settings.JOBSITE_LOCAL_START_TIMEOUT_SECONDS,
        max_disruptions=settings.JOBSITE_K8S_MAX_DISRUPTIONS,
    )


# The jobs holding resources on a backend, with their attempts: read by every sync round, compiled once.
HOLDING = Prepared(lambda backend: Job.objects.filter(phase__in=RESOURCE_PHASES, current_attempt__backend=backend)
                   .select_related("current_attempt"), backend=str)
# The attempts of these jobs that count against their limits: (job, outcome, how many).
COUNTED_OUTCOMES = Prepared(lambda jobs: Attempt.objects.filter(
    job_id__in=jobs, outcome__in=("Requeued", *DISRUPTION_OUTCOMES)).values_list("job_id", "outcome")
    .annotate(n=Count("id")).values_list("job_id", "outcome", "n"), jobs=list)


def sync_jobs(*, backend: Backend | None = None, now: datetime | None = None) -> int:
    backend = backend or get_backend()
    actuator = get_actuator(backend)
    timing = timing_for(backend)
    jobs = HOLDING.all(backend=backend.name)
    # One read of the attempts that count against limits: requeues (of jobs still preparing) and disruptions.
    preparing = {j.pk for j in jobs if j.phase == Phase.PREPARING}
    requeues, disruptions = Counter(), Counter()
    for job_id, outcome, n in COUNTED_OUTCOMES.all(jobs=[j.pk for j in jobs]):
        if outcome != "Requeued":
            disruptions[job_id] += n
        elif job_id in preparing:
            requeues[job_id] += n
    actuator.forget({j.current_attempt_id for j in jobs})
    # Launched attempts not yet seen running (still preparing, or unknown since) whose "Started" event is missing:
    # written once a replica is seen running.
    preparing = {j.current_attempt_id for j in jobs if j.phase in (Phase.PREPARING, Phase.UNKNOWN)
                 and j.current_attempt.launched_at is not None}
    unrecorded = preparing - set(STARTED_OF.all(attempts=sorted(preparing)))
    count = 0
    for job in jobs:
        if actuator.in_flight("launch", job.pk) or actuator.in_flight("relaunch", job.pk):
            continue  # half started: what the backend shows of it now says nothing yet
        try:
            sync_job(job, backend=backend, actuator=actuator, timing=timing, now=now or timezone.now(),
                     requeues=requeues[job.pk], disruptions=disruptions[job.pk],
                     started_recorded=job.current_attempt_id not in unrecorded)
            count += 1
        except InvalidTransition:  # changed by someone else since we read it; next round sees the new state
            continue
        except Exception:
            log.exception("syncing job %s failed", job.pk)
    return count


def job_view(job: Job, *, requeues: int = 0, stop_sent: str = "", started_recorded: bool = True,
             disruptions: int = 0) -> JobView:
    attempt = job.current_attempt
    return JobView(
        phase=job.phase, status=job.status, message=job.message, reason=job.reason, job_type=job.job_type,
        terminating_since=job.terminating_since, admitted_at=job.admitted_at,
        active_deadline_seconds=job.active_deadline_seconds, retry_at=job.retry_at,
        updated_at=job.updated_at, attempt_started_at=attempt.started_at, launched=attempt.launched_at is not None,
        launched_at=attempt.launched_at, started_recorded=started_recorded,
        node=attempt.node, restarts=attempt.backend_data.get("restarts", 0), requeues=requeues, stop_sent=stop_sent,
        attempt_number=attempt.number, termination_target=job.termination_target, exit_code=job.exit_code,
        failed_rank=attempt.failed_rank, disruptions=disruptions,
    )


def sync_job(job: Job, *, backend: Backend, actuator: Actuator | None = None, timing: Timing | None = None,
             now: datetime | None = None, requeues: int = 0, started_recorded: bool = True,
             disruptions: int = 0) -> list[Action]:
    actuator = actuator or get_actuator(backend)
    now = now or timezone.now()
    attempt = job.current_attempt
    view = job_view(job, requeues=requeues, stop_sent=actuator.stop_sent(attempt.pk),
                    started_recorded=started_recorded, disruptions=disruptions)
    seen = [] if not view.launched else observe(job, backend=backend, actuator=actuator)
    actions = reconcile(view, seen, now, timing or timing_for(backend))
    apply(job, actions, actuator=actuator, now=now)
    return actions


def observe(job: Job, *, backend: Backend, actuator: Actuator) -> list[ReplicaObservation]:
    """What the backend shows of the job's launched attempt (a launch cut short is tried again first), with the
    events it saw recorded as job events."""
    attempt = job.current_attempt
    resumed = actuator.resume_launch(job_id=job.pk, attempt_number=attempt.number, replicas=attempt.replicas)
    if resumed is not None:
        return resumed
    seen = backend.observe(job_id=job.pk, attempt_number=attempt.number, replicas=attempt.replicas)
    try:
        events = backend.events(job_id=job.pk, attempt_number=attempt.number, replicas=attempt.replicas)
        if events and backend_events_record(job_id=job.pk, attempt_number=attempt.number, replicas=attempt.replicas,
                                            events=events):
            backend.events_recorded({ev.key for ev in events})
    except Exception:
        log.exception("recording the Kubernetes events of job %s failed", job.pk)
    return seen


def apply(job: Job, actions: list[Action], *, actuator: Actuator, now: datetime) -> None:
    """Perform reconcile's actions: the writes in one transaction, then the backend calls (handed to the actuator,
    which runs them on its pool in the scheduler loop)."""
    if not actions:  # the usual round of a running job: no transaction at all
        return
    attempt = job.current_attempt
    calls = []
    with transaction.atomic():
        for action in actions:
            match action:
                case Launch():
                    calls.append(lambda: actuator.launch(job.pk))
                case Relaunch():
                    calls.append(lambda: actuator.relaunch(job.pk))
                case Stop(force=force):
                    calls.append(lambda force=force: actuator.stop(
                        attempt_id=attempt.pk, job_id=job.pk, attempt_number=attempt.number,
                        replicas=attempt.replicas, force=force))
                case RecordStarted(at=at):
                    services.attempt_record_started(job=job, attempt=attempt, at=at)
                case CountRestart():
                    services.attempt_count_restart(attempt=attempt)
                case Transition():
                    services.job_transition(job=job, phase=action.phase, status=action.status, reason=action.reason,
                                            message=action.message, event_reason=action.event_reason, now=now,
                                            **action.fields)
                case Terminate():
                    extra = {"retry_at": action.retry_at} if action.retry_at else {}
                    if action.failed_rank is not None:
                        services.attempt_record_failure(attempt=attempt, rank=action.failed_rank)
                        extra["exit_code"] = action.exit_code
                    services.job_terminate(job=job, target=action.target, reason=action.reason,
                                           message=action.message, now=now, **extra)
                case RetryOrFail():
                    if action.failed_rank is not None:
                        services.attempt_record_failure(attempt=attempt, rank=action.failed_rank)
                    services.job_retry_or_fail(job=job, exit_code=action.exit_code, reason=action.reason,
                                               message=action.message, now=now)
                case FinishTermination():
                    target = job.termination_target or Phase.CANCELLED
                    status = services.terminated_status(target, job.reason)
                    message = f"{job.message}; {action.abandoned}" if action.abandoned else job.message
                    services.job_transition(job=job, phase=target, status=status, reason=job.reason,
                                            message=message, exit_code=action.exit_code, now=now,
                                            event_reason="Terminated",
                                            event_type=EventType.WARNING if action.abandoned else EventType.NORMAL)
    # After the writes committed (sync runs outside any transaction of its own), whatever the backend call does.
    for call in calls:
        call()


# Ended jobs whose pods and working dirs are due for deletion (read every sync round, mostly to find none).
EXPIRED = Prepared(lambda now: Job.objects.filter(cleaned_at__isnull=True, expires_at__lte=now,
                                                  phase__in=TERMINAL_PHASES).values_list("id", flat=True)[:500],
                   now=datetime)
ATTEMPTS_OF = Prepared(lambda jobs, backend: Attempt.objects.filter(job_id__in=jobs, backend=backend)
                       .values_list("job_id", "number", "replicas"), jobs=list, backend=str)


def housekeeping(*, backend: Backend | None = None, now: datetime | None = None) -> None:
    """Clocks: move BACKOFF jobs whose delay is over back to PENDING; delete pods and working dirs after their TTL
    (through the actuator: the job is marked cleaned once its backend has deleted them)."""
    backend = backend or get_backend()
    now = now or timezone.now()
    services.jobs_release_backoff(now=now)
    actuator = get_actuator(backend)
    due = EXPIRED.all(now=now)
    attempts: dict[int, list[tuple[int, int]]] = {job_id: [] for job_id in due}
    for job_id, number, replicas in ATTEMPTS_OF.all(jobs=due, backend=backend.name):
        attempts[job_id].append((number, replicas))
    for job_id, left in attempts.items():
        actuator.cleanup(job_id, left, lambda job_id=job_id: services.job_mark_cleaned(job_id=job_id,
                                                                                        now=timezone.now()))


def live_attempts(backend: Backend) -> set[tuple[int, int]]:
    """(job, attempt number) of the backend's attempts that keep what they hold: the current attempt of a job
    holding resources (PREPARING, RUNNING, TERMINATING, UNKNOWN)."""
    return set(
        Attempt.objects.filter(job__phase__in=RESOURCE_PHASES, job__current_attempt=F("pk"), backend=backend.name)
        .values_list("job_id", "number")
    )


def orphans_delete(*, backend: Backend | None = None) -> list[str]:
    """Have the backend delete what belongs to no live attempt (it reads the live ones from the database only after
    listing what exists, so one launched meanwhile is never taken for an orphan); the names deleted."""
    backend = backend or get_backend()
    return backend.delete_orphans(live=lambda: live_attempts(backend))
