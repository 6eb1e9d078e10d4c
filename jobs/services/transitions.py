"""Phase changes: ``job_transition`` is the one place a job's phase and status change. It locks the job's row, checks
the state machine, writes an event, closes the attempt when resources are released, and queues the side effects
(live update, scheduling pass) for after commit. ``job_terminate`` is the transition that starts stopping a job.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..choices import QUEUED_PHASES, RESOURCE_PHASES, TERMINAL_PHASES, EventType, Phase
from ..models import Job
from ..prepared import Prepared
from ..prepared_writes import update_fields
from ..state_machine import ERROR_STATUSES, InvalidTransition, check_transition
from ..wakeup import request_pass
from .dependencies import dependents_on_end
from .events import event_record
from .notifications import notifications_on_transition

UNSET: Any = object()

DEFAULT_STATUS = {
    Phase.SUBMITTED: "Submitted",
    Phase.INADMISSIBLE: "Inadmissible",
    Phase.PENDING: "Pending",
    Phase.BACKOFF: "Error",
    Phase.PREPARING: "ContainerCreating",
    Phase.RUNNING: "Running",
    Phase.TERMINATING: "Terminating",
    Phase.SUCCEEDED: "Succeeded",
    Phase.FAILED: "Fail",
    Phase.CANCELLED: "Cancelled",
    Phase.TIMED_OUT: "TimedOut",
    Phase.PREEMPTED: "Preempted",
    Phase.UNKNOWN: "Unknown",
}


def _on_commit_effects(job_id: int, old_phase: str, new_phase: str) -> None:
    from ..live_publisher import publish_job_changes

    publish_job_changes([job_id])  # never raises
    released = old_phase in RESOURCE_PHASES and new_phase not in RESOURCE_PHASES
    queued = new_phase in QUEUED_PHASES and old_phase not in QUEUED_PHASES
    # A pass for freed or queued resources; and the scheduler's sync for pods to stop.
    stopping = new_phase == Phase.TERMINATING and old_phase != Phase.TERMINATING
    if released or queued or stopping:
        request_pass(sync=stopping)


# Event types as Kubernetes means them: Warning for failures, evictions and anything a person should look at.
WARNING_STATUSES = frozenset({"Error", "Fail", *ERROR_STATUSES})
WARNING_REASONS = frozenset({
    "Error", "CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "FailedImagePull", "ContainerCannotRun",
    "NodeLost", "NodeUnresponsive", "Preempted", "Evicted", "OOMKilled", "DeadlineExceeded", "RequeueLimitExceeded",
    "Requeued", "Disrupted", "DisruptionLimitExceeded", "GpusIdle", "GpusIdleStopped",
})


# The job a transition moves, locked, with its current attempt: the hottest read of all, compiled once.
JOB_LOCKED = Prepared(lambda pk: Job.objects.select_for_update(of=("self",)).select_related("current_attempt")
                      .filter(pk=pk), pk=int)


def in_the_callers_transaction(func):
    """Run ``func`` in the caller's transaction when there is one, without a savepoint of its own, else in one of
    its own. A transition writes nothing before its check: one refused (``InvalidTransition``, raised before any
    write) leaves the caller's transaction as it was, and the caller goes on (a pass, a job cancelled since it was
    read). An error after a write ends the caller's transaction too (PostgreSQL refuses its next statement), as it
    did with the savepoint when the caller did not catch it; no caller catches one and goes on in the same
    transaction. The savepoint and its release were two round trips to the database for every transition. (Django's
    ``atomic(savepoint=False)`` is not this: any exception out of it, the refusal included, marks the caller's
    transaction for rollback.)"""
    @functools.wraps(func)
    def inner(*args, **kwargs):
        if transaction.get_connection().in_atomic_block:
            return func(*args, **kwargs)
        with transaction.atomic():
            return func(*args, **kwargs)
    return inner


@in_the_callers_transaction
def job_transition(
    *,
    job: Job,
    phase: str,
    status: str | None = None,
    reason: str = "",
    message: str = "",
    event_type: str | None = None,
    event_reason: str | None = None,
    exit_code: int | None = UNSET,
    queue_position: int | None = None,
    now: datetime | None = None,
    from_phases: Collection[str] | None = None,
    locked: bool = False,
    **fields: Any,
) -> Job:
    """Move ``job`` to ``phase`` (locking its row), record an event and queue after-commit effects.

    Raises ``InvalidTransition`` if the state machine forbids it, or if ``from_phases`` is given and the job is in
    none of them (a caller that decided on what it read earlier: a job cancelled since is not queued again). A call
    that changes neither phase, status nor reason only refreshes message/position and writes no event.
    ``locked``: ``job`` is as ``job_locked`` or a transition of the caller's transaction returned it (its row locked
    since, so as it is): it is not read again, and it is the job changed.
    """
    now = now or timezone.now()
    current = job if locked else JOB_LOCKED.get(pk=job.pk)
    if from_phases is not None and current.phase not in from_phases:
        raise InvalidTransition(current.phase, phase)
    check_transition(current.phase, phase)
    before = _column_values(current)
    status = status or DEFAULT_STATUS[Phase(phase)]
    changed = (current.phase, current.status, current.reason) != (phase, status, reason)
    old_phase = current.phase

    current.phase = phase
    current.status = status
    current.reason = reason
    current.message = message
    current.queue_position = queue_position if phase == Phase.PENDING else None
    if phase != Phase.PENDING:  # admitted, inadmissible or out of the queue: no start to expect any more
        current.estimated_start, current.estimate_basis = None, ""
    if exit_code is not UNSET:
        current.exit_code = exit_code
    if old_phase == Phase.BACKOFF:
        current.retry_at = None  # the backoff is over
    for name, value in fields.items():
        setattr(current, name, value)
    if phase == Phase.RUNNING and current.started_at is None:
        current.started_at = now
    if phase == Phase.TERMINATING and old_phase != Phase.TERMINATING:
        current.terminating_since = now
    if phase != Phase.TERMINATING:
        current.terminating_since = None
        current.termination_target = ""
    if phase not in RESOURCE_PHASES:
        current.over_quota = False
    if phase == Phase.PENDING and old_phase != Phase.PENDING:
        # Queued again (retry, requeue, preemption, restart): what the job shows is no longer an attempt's; the
        # ended attempt keeps its own exit code and times.
        current.exit_code = current.admitted_at = current.started_at = None
    if phase in TERMINAL_PHASES:
        current.finished_at = now
        current.expires_at = now + timedelta(seconds=current.ttl_seconds_after_finished)
    elif old_phase in TERMINAL_PHASES:
        current.finished_at = current.expires_at = None

    attempt = current.current_attempt
    if attempt and old_phase in RESOURCE_PHASES and phase not in RESOURCE_PHASES and attempt.ended_at is None:
        attempt.ended_at = now
        attempt.outcome = reason or status
        if exit_code is not UNSET:
            attempt.exit_code = exit_code
        if attempt.started_at:
            attempt.gpu_seconds = attempt.gpu * attempt.replicas * (now - attempt.started_at).total_seconds()
        update_fields(attempt, ["ended_at", "outcome", "exit_code", "gpu_seconds"])
    if attempt and phase == Phase.RUNNING and attempt.running_at is None:
        attempt.running_at = now
        update_fields(attempt, ["running_at"])

    # Only the columns that changed (and updated_at): the others were read under the row's lock and are as they are.
    update_fields(current, [*(k for k, v in _column_values(current).items() if before[k] != v), "updated_at"])
    if changed:
        warning = (status in WARNING_STATUSES or reason in WARNING_REASONS
                   or phase in {Phase.FAILED, Phase.INADMISSIBLE, Phase.UNKNOWN})
        event = event_record(
            job=current,
            attempt=attempt,
            type=event_type or (EventType.WARNING if warning else EventType.NORMAL),
            reason=event_reason or reason or status,
            message=message,
            publish=False,
        )
        if phase != old_phase:
            notifications_on_transition(job=current, old_phase=old_phase, event=event)
    if phase in TERMINAL_PHASES and old_phase not in TERMINAL_PHASES:
        dependents_on_end(job=current, now=now)
    transaction.on_commit(lambda: _on_commit_effects(current.pk, old_phase, phase), robust=True)
    for f in Job._meta.concrete_fields:  # the caller's instance shows the new state too
        setattr(job, f.attname, getattr(current, f.attname))
    return current


def job_locked(*, job_id: int) -> Job:
    """The job (with its current attempt) as it is, its row locked until the caller's transaction ends: for a
    transition of it with ``locked=True``, which then reads it no more."""
    return JOB_LOCKED.get(pk=job_id)


def _column_values(job: Job) -> dict[str, Any]:
    """The job's column values by attribute name (a copy of mutable ones, so a change in place still shows)."""
    loaded = job.__dict__  # as getattr gives them, without a descriptor call per column (a deferred one is read)
    values = {name: loaded[name] if name in loaded else getattr(job, name) for name in _COLUMNS}
    for name in _MUTABLE:
        values[name] = copy.copy(values[name])
    return values


_COLUMNS = tuple(f.attname for f in Job._meta.concrete_fields if not f.primary_key)
_MUTABLE = frozenset(f.attname for f in Job._meta.concrete_fields if f.get_internal_type() == "JSONField")


def terminated_status(phase: str, reason: str) -> str:
    """The status a job shows once it has ended in ``phase`` for ``reason``."""
    if phase == Phase.CANCELLED:
        return {"StoppedByUser": "Stopped", "DeletedByUser": "Deleted"}.get(reason, "Cancelled")
    return DEFAULT_STATUS[Phase(phase)]

def job_terminate(*, job: Job, target: str, reason: str, message: str, now: datetime | None = None,
                  **fields: Any) -> Job:
    """Start stopping a job's processes/pods: the scheduler, woken after commit, asks its backend to stop them
    with the job's grace period; the job ends in ``target`` once the backend reports them gone."""
    return job_transition(job=job, phase=Phase.TERMINATING, reason=reason, message=message,
                          termination_target=target, now=now, **fields)
