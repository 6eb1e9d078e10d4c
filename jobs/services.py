"""Every write of the jobs app. Views, API views and the scheduler call these; nothing else changes a job.

``job_transition`` is the one place a job's phase/status changes: it checks the state machine, writes an
event, closes the attempt when resources are released, and queues side effects for after commit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Case, Q, TextField, Value, When
from django.utils import timezone

from . import limits, rules
from .choices import QUEUED_PHASES, RESOURCE_PHASES, TERMINAL_PHASES, EventType, JobType, Phase, Priority, Resource
from .models import Attempt, Group, GroupQuota, Image, InstanceType, Job, JobEvent, Membership, Node, SubmitKey
from .rules import QuotaLimits, fmt_amount, fmt_duration
from .state_machine import ERROR_STATUSES, InvalidTransition, check_transition
from .wakeup import request_pass

log = logging.getLogger(__name__)

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
    from .realtime import publish_job_changes

    publish_job_changes([job_id])  # never raises
    released = old_phase in RESOURCE_PHASES and new_phase not in RESOURCE_PHASES
    queued = new_phase in QUEUED_PHASES and old_phase not in QUEUED_PHASES
    # A pass for freed or queued resources; the scheduler's sync for pods to stop.
    if released or queued or (new_phase == Phase.TERMINATING and old_phase != Phase.TERMINATING):
        request_pass()


def event_record(
    *, job: Job, reason: str, message: str = "", type: str = EventType.NORMAL, attempt: Attempt | None = None,
    publish: bool = True, at: datetime | None = None,
) -> JobEvent:
    """Append an event to a job's trail; open detail pages get it after commit (``job_transition`` publishes
    its own change, so it passes ``publish=False``). ``at``: when it happened, when that was before now (a replica
    seen running started a moment ago)."""
    event = JobEvent.objects.create(job=job, attempt=attempt or job.current_attempt, type=type, reason=reason,
                                    message=message)
    if at is not None and at < event.time:
        JobEvent.objects.filter(pk=event.pk).update(time=at)
        event.time = at
    if publish:
        from .realtime import publish_job_changes

        transaction.on_commit(lambda: publish_job_changes([job.pk]), robust=True)
    return event


# Event types as Kubernetes means them: Warning for failures, evictions and anything a person should look at.
WARNING_STATUSES = frozenset({"Error", "Fail", *ERROR_STATUSES})
WARNING_REASONS = frozenset({
    "Error", "CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "FailedImagePull", "ContainerCannotRun",
    "NodeLost", "NodeUnresponsive", "Preempted", "Evicted", "OOMKilled", "DeadlineExceeded", "RequeueLimitExceeded",
    "Requeued",
})


@transaction.atomic
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
    **fields: Any,
) -> Job:
    """Move ``job`` to ``phase`` (locking its row), record an event and queue after-commit effects.

    Raises ``InvalidTransition`` if the state machine forbids it. A call that changes neither phase, status nor
    reason only refreshes message/position and writes no event.
    """
    now = now or timezone.now()
    current = Job.objects.select_for_update(of=("self",)).select_related("current_attempt").get(pk=job.pk)
    check_transition(current.phase, phase)
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
        attempt.save(update_fields=["ended_at", "outcome", "exit_code", "gpu_seconds"])
    if attempt and phase == Phase.RUNNING and attempt.running_at is None:
        attempt.running_at = now
        attempt.save(update_fields=["running_at"])

    current.save()
    if changed:
        warning = (status in WARNING_STATUSES or reason in WARNING_REASONS
                   or phase in {Phase.FAILED, Phase.INADMISSIBLE, Phase.UNKNOWN})
        event_record(
            job=current,
            attempt=attempt,
            type=event_type or (EventType.WARNING if warning else EventType.NORMAL),
            reason=event_reason or reason or status,
            message=message,
            publish=False,
        )
    transaction.on_commit(lambda: _on_commit_effects(current.pk, old_phase, phase), robust=True)
    for f in Job._meta.concrete_fields:  # the caller's instance shows the new state too
        setattr(job, f.attname, getattr(current, f.attname))
    return current


def job_queue_info_update(updates: dict[int, str]) -> None:
    """Refresh the wait message of pending jobs whose phase and reason are unchanged ({job id: message}).

    Not a status change (no event): one bulk write per scheduling pass, however long the queue. Queue positions
    are not stored: they are derived where they are read (``selectors.queue_positions``).
    """
    _bulk_update([Job(pk=pk, message=message) for pk, message in updates.items()], ["message"])


BLOCKED_REASON = "BlockedByQueueHead"


def job_queue_behind_update(*, behind: dict[int, str], jobs: Iterable[int] = (), groups: Iterable[int] = ()) -> None:
    """Pending jobs that wait behind the head of their group's queue: reason BlockedByQueueHead and the message of
    their group in ``behind`` ({group id: message}, which names the head). For ``jobs`` (pending jobs the pass
    decided so) and for every job already waiting behind a head in ``groups`` (whose head changed).

    Not an event per job: a job behind the head was not looked at, only its head was. One UPDATE for all of them
    (none where nothing changed), published after commit.
    """
    jobs, groups = list(jobs), [g for g in groups if g in behind]
    if not jobs and not groups:
        return
    if connection.vendor == "postgresql":  # the groups' messages as a VALUES list: no CASE of a thousand arms
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Job._meta.db_table} AS j SET reason = %s, message = v.message, updated_at = %s FROM (VALUES "
                + ", ".join(["(%s::bigint, %s::text)"] * len(behind)) + ") AS v(group_id, message) "
                "WHERE j.group_id = v.group_id AND j.phase = %s AND (j.id = ANY(%s) OR (j.group_id = ANY(%s) "
                "AND j.reason = %s)) AND NOT (j.reason = %s AND j.message = v.message) RETURNING j.id",
                [BLOCKED_REASON, timezone.now(), *(x for item in behind.items() for x in item), Phase.PENDING, jobs,
                 groups, BLOCKED_REASON, BLOCKED_REASON])
            changed = [row[0] for row in cursor.fetchall()]
    else:
        message = Case(*[When(group_id=g, then=Value(m)) for g, m in behind.items()], output_field=TextField())
        rows = (Job.objects.filter(phase=Phase.PENDING)
                .filter(Q(pk__in=jobs) | Q(group_id__in=groups, reason=BLOCKED_REASON))
                .filter(group_id__in=list(behind))
                .exclude(reason=BLOCKED_REASON, message=message))
        changed = list(rows.values_list("pk", flat=True))
        Job.objects.filter(pk__in=changed).update(reason=BLOCKED_REASON, message=message, updated_at=timezone.now())
    if not changed:
        return
    from .realtime import publish_job_changes

    transaction.on_commit(lambda: publish_job_changes(changed), robust=True)


def job_estimate_update(updates: dict[int, tuple[datetime | None, str]]) -> None:
    """Record when pending jobs are expected to start, and on what basis ("deadlines" or "history"; a None start:
    not within the scheduler's horizon). The scheduling pass passes only the estimates that changed.

    Not a status change (no event): one bulk write per scheduling pass, however long the queue. Written after the
    pass has committed, so only jobs still pending (their rows locked for the write) take their estimate.
    """
    if not updates:
        return
    with transaction.atomic():
        pending = Job.objects.select_for_update().filter(pk__in=list(updates), phase=Phase.PENDING)
        _bulk_update([Job(pk=pk, estimated_start=updates[pk][0], estimate_basis=updates[pk][1])
                      for pk in pending.values_list("pk", flat=True)], ["estimated_start", "estimate_basis"])


def _bulk_update(jobs: list[Job], fields: list[str]) -> None:
    """Write ``fields`` of many jobs at once and publish them after commit (one query, one small message each)."""
    if not jobs:
        return
    if connection.vendor == "postgresql":
        _update_from_values(jobs, fields)
    else:
        Job.objects.bulk_update(jobs, fields, batch_size=1000)
    from .realtime import publish_job_changes

    changed = [j.pk for j in jobs]
    transaction.on_commit(lambda: publish_job_changes(changed), robust=True)


def _update_from_values(jobs: list[Job], fields: list[str], batch: int = 5000) -> None:
    """PostgreSQL: ``UPDATE … FROM (VALUES …)``, one statement per ``batch`` jobs (Django's ``bulk_update`` builds a
    CASE per field and row, which takes seconds of Python for thousands of rows)."""
    columns = [Job._meta.get_field(f) for f in fields]
    row = "(%s::bigint, " + ", ".join(f"%s::{c.db_type(connection)}" for c in columns) + ")"
    names = ", ".join(["id", *(c.column for c in columns)])
    sets = ", ".join(f"{c.column} = v.{c.column}" for c in columns)
    with connection.cursor() as cursor:
        for start in range(0, len(jobs), batch):
            chunk = jobs[start:start + batch]
            params: list[Any] = []
            for job in chunk:
                params.append(job.pk)
                params.extend(c.get_db_prep_save(getattr(job, c.attname), connection) for c in columns)
            cursor.execute(f"UPDATE {Job._meta.db_table} AS j SET {sets} FROM (VALUES {', '.join([row] * len(chunk))}) "
                           f"AS v({names}) WHERE j.id = v.id", params)


# --- submission ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSpec:
    name: str
    group: Group
    image: Image
    instance_type: InstanceType
    command: str
    env: dict[str, str]
    replicas: int
    job_type: str
    priority: int
    preemptible: bool
    backoff_limit: int
    active_deadline_seconds: int
    ttl_seconds_after_finished: int


def _quota_problem(group: Group, instance_type: InstanceType, replicas: int, preemptible: bool) -> str | None:
    """Why a request can never fit the group's quotas (a preemptible job may borrow up to the limit), or None."""
    request = instance_type.request
    for q in GroupQuota.objects.filter(group=group):
        total = request[q.resource] * replicas
        label = Resource(q.resource).label.split(" ")[0]
        if q.user_quota is not None and total > q.user_quota:
            return (f"asks {fmt_amount(q.resource, total)}, more than the user {label} quota "
                    f"{fmt_amount(q.resource, q.user_quota)} in {group.name}")
        ceiling = QuotaLimits(q.quota, q.limit, q.user_quota).ceiling(preemptible)
        if ceiling is not None and total > ceiling:
            what = "limit" if ceiling != q.quota else "quota"
            return (f"asks {fmt_amount(q.resource, total)}, more than the group {label} {what} "
                    f"{fmt_amount(q.resource, ceiling)} of {group.name}")
    return None


def job_spec_validate(*, user: AbstractBaseUser, data: dict[str, Any]) -> JobSpec:
    """Check a submission against the user's groups, the group's images and instance types, and its quotas.

    ``data`` holds already type-checked values (from the form or the API serializer), with names for group,
    image and instance_type. Raises ``ValidationError`` with a message per field.
    """
    errors: dict[str, str] = {}
    group = image = instance_type = None

    group_name = data.get("group") or ""
    group = Group.objects.filter(name=group_name).first()
    if group is None:
        errors["group"] = f"Unknown group '{group_name}'."
    elif not (user.is_superuser or Membership.objects.filter(group=group, user=user).exists()):
        errors["group"] = f"You are not a member of group '{group_name}'."
        group = None

    image_name = data.get("image") or ""
    image = Image.objects.filter(name=image_name).first()
    if image is None:
        errors["image"] = f"Unknown image '{image_name}'."
    elif group and not image.groups.filter(pk=group.pk).exists():
        errors["image"] = f"Image '{image_name}' is not allowed in group '{group.name}'."

    it_name = data.get("instance_type") or ""
    instance_type = InstanceType.objects.filter(name=it_name).first()
    if instance_type is None:
        errors["instance_type"] = f"Unknown instance type '{it_name}'."
    elif group and not instance_type.groups.filter(pk=group.pk).exists():
        errors["instance_type"] = f"Instance type '{it_name}' is not allowed in group '{group.name}'."

    command = data.get("command") or ""
    if not command.strip():
        errors["command"] = "Enter a command."
    elif len(command.encode()) > limits.COMMAND_MAX_BYTES:
        errors["command"] = f"The command is longer than {limits.COMMAND_MAX_BYTES // 1024} KiB."
    elif "\x00" in command:
        errors["command"] = "The command contains a NUL character."

    env = data.get("env") or {}
    env_error = _env_problem(env)
    if env_error:
        errors["env"] = env_error

    name = (data.get("name") or "").strip()
    if len(name) > limits.NAME_MAX:
        errors["name"] = f"Use at most {limits.NAME_MAX} characters."
    elif any(ord(c) < 32 for c in name):
        errors["name"] = "The name contains control characters."

    replicas = _or_default(data.get("replicas"), 1)
    if not isinstance(replicas, int) or not 1 <= replicas <= limits.REPLICAS_MAX:
        errors["replicas"] = f"Use 1 to {limits.REPLICAS_MAX} replicas."

    if group and instance_type and "instance_type" not in errors and "replicas" not in errors:
        problem = _quota_problem(group, instance_type, replicas, bool(data.get("preemptible")))
        if problem:
            errors["replicas" if replicas > 1 else "instance_type"] = f"This job can never run: it {problem}."

    if errors:
        raise ValidationError({k: [v] for k, v in errors.items()})

    job_type = data.get("job_type") or JobType.TRAINING
    return JobSpec(
        name=name or _default_name(command),
        group=group,
        image=image,
        instance_type=instance_type,
        command=command,
        env={str(k): str(v) for k, v in env.items()},
        replicas=replicas,
        job_type=job_type,
        priority=data.get("priority", Priority.NORMAL) if data.get("priority") is not None else Priority.NORMAL,
        preemptible=bool(data.get("preemptible", False)),
        backoff_limit=_or_default(data.get("backoff_limit"), settings.JOBSITE_DEFAULT_BACKOFF_LIMIT),
        active_deadline_seconds=_or_default(
            data.get("active_deadline_seconds"),
            settings.JOBSITE_DEFAULT_INTERACTIVE_DEADLINE_SECONDS if job_type == JobType.INTERACTIVE
            else settings.JOBSITE_DEFAULT_ACTIVE_DEADLINE_SECONDS,
        ),
        ttl_seconds_after_finished=_or_default(
            data.get("ttl_seconds_after_finished"), settings.JOBSITE_DEFAULT_TTL_SECONDS_AFTER_FINISHED
        ),
    )


def _or_default(value: int | None, default: int) -> int:
    return default if value is None else value


def _default_name(command: str) -> str:
    first = command.strip().split()[0] if command.strip() else "job"
    return first.rsplit("/", 1)[-1][:40] or "job"


def _env_problem(env: Any) -> str | None:
    if not isinstance(env, dict):
        return "Give environment variables as an object of NAME: value."
    if len(env) > limits.ENV_MAX_VARS:
        return f"Use at most {limits.ENV_MAX_VARS} environment variables."
    for key, value in env.items():
        if not isinstance(key, str) or not limits.ENV_NAME_RE.match(key):
            return f"'{key}' is not a valid variable name (letters, digits and _, not starting with a digit)."
        if key in limits.RESERVED_ENV:
            return f"'{key}' is set by jobsite and cannot be overridden."
        if not isinstance(value, str | int | float | bool):
            return f"The value of '{key}' must be a string."
        if len(str(value).encode()) > limits.ENV_VALUE_MAX_BYTES:
            return f"The value of '{key}' is longer than {limits.ENV_VALUE_MAX_BYTES // 1024} KiB."
        if "\x00" in str(value):
            return f"The value of '{key}' contains a NUL character."
    return None


# How long an `Idempotency-Key` of a submit answers the job it made; after that the key may make a new job.
SUBMIT_KEY_TTL = timedelta(hours=24)


class SubmitKeyTaken(Exception):
    """Another submit with the same `Idempotency-Key` committed first: nothing was written; ask
    ``job_submitted_with`` for its job."""


class SubmitKeyReused(ValidationError):
    """The `Idempotency-Key` made a job from another request body within ``SUBMIT_KEY_TTL``."""


def job_submitted_with(*, user: AbstractBaseUser, key: str, fingerprint: str) -> Job | None:
    """The job a submit of ``user`` with this `Idempotency-Key` made within ``SUBMIT_KEY_TTL``, or None.

    Raises ``SubmitKeyReused`` when that submit had another body (``fingerprint``)."""
    row = (SubmitKey.objects.select_related("job")
           .filter(user=user, key=key, created_at__gte=timezone.now() - SUBMIT_KEY_TTL).first())
    if row is None:
        return None
    if row.fingerprint != fingerprint:
        raise SubmitKeyReused(
            f"The Idempotency-Key '{key}' was used for another request body (job #{row.job_id}) within the last "
            f"{SUBMIT_KEY_TTL.total_seconds() / 3600:g} hours; send a new key for a new job."
        )
    return row.job


@transaction.atomic
def job_submit(*, user: AbstractBaseUser, spec: JobSpec, idempotency_key: str = "", fingerprint: str = "") -> Job:
    """Create a job from a validated spec. With ``idempotency_key`` the key is recorded with the job in the same
    transaction; a concurrent submit that recorded the same key first makes this one write nothing and raise
    ``SubmitKeyTaken`` (the unique constraint decides, not a check before the insert)."""
    now = timezone.now()
    it = spec.instance_type
    job = Job.objects.create(
        name=spec.name,
        group=spec.group,
        user=user,
        image=spec.image,
        image_url=spec.image.url,
        instance_type=it,
        gpu=it.gpu,
        cpu_millicores=it.cpu_millicores,
        memory_bytes=it.memory_bytes,
        command=spec.command,
        env=spec.env,
        replicas=spec.replicas,
        job_type=spec.job_type,
        priority=spec.priority,
        preemptible=spec.preemptible,
        backoff_limit=spec.backoff_limit,
        active_deadline_seconds=spec.active_deadline_seconds,
        ttl_seconds_after_finished=spec.ttl_seconds_after_finished,
        phase=Phase.SUBMITTED,
        status="Submitted",
        queued_at=now,
    )
    if idempotency_key:
        # An expired row of the same key would block the insert; the user's other expired keys go with it.
        SubmitKey.objects.filter(user=user, created_at__lt=now - SUBMIT_KEY_TTL).delete()
        try:
            with transaction.atomic():
                SubmitKey.objects.create(user=user, key=idempotency_key, fingerprint=fingerprint, job=job,
                                         created_at=now)
        except IntegrityError as exc:
            raise SubmitKeyTaken(idempotency_key) from exc
    # The event publishes the new job after commit (the list shows it); then a pass queues it.
    event_record(job=job, reason="Submitted", message=f"Submitted by {user.get_username()} to {spec.group.name}")
    transaction.on_commit(request_pass, robust=True)
    return job


# --- user actions -------------------------------------------------------------------------------------------


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


def terminated_status(phase: str, reason: str) -> str:
    """The status a job shows once it has ended in ``phase`` for ``reason``."""
    if phase == Phase.CANCELLED:
        return {"StoppedByUser": "Stopped", "DeletedByUser": "Deleted"}.get(reason, "Cancelled")
    return DEFAULT_STATUS[Phase(phase)]


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


def job_terminate(*, job: Job, target: str, reason: str, message: str, now: datetime | None = None,
                  **fields: Any) -> Job:
    """Start stopping a job's processes/pods: the scheduler, woken after commit, asks its backend to stop them
    with the job's grace period; the job ends in ``target`` once the backend reports them gone."""
    return job_transition(job=job, phase=Phase.TERMINATING, reason=reason, message=message,
                          termination_target=target, now=now, **fields)


def job_preempt(*, job: Job, by_job_id: int, message: str, now: datetime | None = None) -> Job:
    """Evict a running preemptible job for ``by_job_id``: a training job comes back PENDING (keeping its place
    in the queue, a new attempt, no backoff spent); an interactive one ends PREEMPTED."""
    target = Phase.PENDING if job.job_type == JobType.TRAINING else Phase.PREEMPTED
    job = job_terminate(job=job, target=target, reason="Preempted", message=message, now=now)
    by = Job.objects.filter(pk=by_job_id).first()
    if by:
        event_record(job=by, reason="Preempting", message=f"Preempting job #{job.pk} ({job.name})")
    return job


# --- scheduler-facing ---------------------------------------------------------------------------------------


def job_admit(*, job: Job, backend: str, placement: list[dict[str, Any]], over_quota: bool = False,
              nominated: bool = False, now: datetime | None = None) -> Attempt:
    """Admit a queued job: a new attempt in PREPARING holding its resources. Launching happens after commit."""
    now = now or timezone.now()
    number = (job.attempts.order_by("-number").values_list("number", flat=True).first() or 0) + 1
    attempt = Attempt.objects.create(
        job=job,
        number=number,
        replicas=job.replicas,
        gpu=job.gpu,
        backend=backend,
        node=",".join(sorted({p["node"] for p in placement})),
        placement={str(rank): p for rank, p in enumerate(placement)},
        started_at=now,
    )
    message = f"Attempt {number} admitted" + (f" on {attempt.node}" if attempt.node else "")
    if over_quota:
        message += ", over its group's quota on idle resources: first to be preempted"
    if nominated:
        message += ", on the resources freed by the jobs it preempted"
    job_transition(job=job, phase=Phase.PREPARING, reason="Admitted", event_reason="Admitted", message=message,
                   current_attempt=attempt, admitted_at=now, exit_code=None, over_quota=over_quota, retry_at=None,
                   now=now)
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


# --- backend bookkeeping (not status: no event) -------------------------------------------------------------


def attempt_claim_launch(*, attempt: Attempt, now: datetime | None = None) -> bool:
    """Claim the launch of an attempt: True for exactly one caller (the pass's after-commit hook or a sync)."""
    return bool(Attempt.objects.filter(pk=attempt.pk, launched_at__isnull=True).update(
        launched_at=now or timezone.now()))


def attempt_record_launch(*, attempt: Attempt, backend_data: dict[str, Any]) -> None:
    """Keep what the backend needs to find the attempt's processes or pods again."""
    attempt.backend_data = backend_data
    Attempt.objects.filter(pk=attempt.pk).update(backend_data=backend_data)


def attempt_record_failure(*, attempt: Attempt, rank: int) -> None:
    """Remember the replica that failed the attempt (the first to fail): its log is the one to read."""
    if attempt.failed_rank is None:
        attempt.failed_rank = rank
        Attempt.objects.filter(pk=attempt.pk, failed_rank__isnull=True).update(failed_rank=rank)


def attempt_count_restart(*, attempt: Attempt) -> int:
    """One more in-place restart of an interactive attempt; returns how many so far."""
    restarts = attempt.backend_data.get("restarts", 0) + 1
    attempt_record_launch(attempt=attempt, backend_data={**attempt.backend_data, "restarts": restarts})
    return restarts


def jobs_release_backoff(*, now: datetime | None = None) -> int:
    """Move the BACKOFF jobs whose delay is over back to PENDING (a clock: the scheduler loop and Celery beat both
    call it; each job changes under its row lock, so twice is harmless). Returns how many moved."""
    now = now or timezone.now()
    moved = 0
    for job in Job.objects.filter(phase=Phase.BACKOFF, retry_at__lte=now):
        try:  # job_transition is atomic itself: a refused move rolls back alone
            job_transition(job=job, phase=Phase.PENDING, reason="Retrying", now=now,
                           message=f"Retrying after {job.message}", retry_at=None)
            moved += 1
        except InvalidTransition:
            continue
    return moved


def job_mark_cleaned(*, job_id: int, now: datetime) -> None:
    """The job's working directories or pods are gone (TTL); its row, events and logs stay."""
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id, cleaned_at__isnull=True).first()
        if job is None:
            return
        job.cleaned_at = now
        job.save(update_fields=["cleaned_at"])
        event_record(job=job, reason="CleanedUp", message=(
            f"Working directories and pods deleted {fmt_duration(job.ttl_seconds_after_finished)} after the end "
            "(ttl_seconds_after_finished); the logs are kept"))



def nodes_record(*, backend: str, nodes: dict[str, dict[str, int]], now: datetime | None = None) -> None:
    """What the scheduler read of its backend's nodes (name -> allocatable): rows of nodes gone are deleted, new
    and changed ones written (nothing is written when nothing changed). Pages and admission read these rows
    instead of calling the cluster."""
    known = dict(Node.objects.filter(backend=backend).values_list("name", "allocatable"))
    if known == nodes:
        return
    now = now or timezone.now()
    with transaction.atomic():
        Node.objects.filter(backend=backend).exclude(name__in=list(nodes)).delete()
        changed = [Node(backend=backend, name=name, allocatable=allocatable, updated_at=now)
                   for name, allocatable in nodes.items() if known.get(name) != allocatable]
        # Two passes at once may both write: the second one's insert becomes an update.
        Node.objects.bulk_create(changed, update_conflicts=True, unique_fields=["backend", "name"],
                                 update_fields=["allocatable", "updated_at"])


# --- acting on many jobs at once (the API's POST jobs/cancel/, the list page's "Cancel/Stop selected") -----------

CANNOT_ACT = "You can act only on your own jobs and on the jobs of groups you administer."


def job_cancel_many(*, ids: Iterable[int], by: AbstractBaseUser, stop: bool = False) -> list[dict[str, Any]]:
    """Cancel (or stop) each job on its own, in its own transaction, in the order given (repeats once). Per id:
    ``{id, ok, status_code, detail, phase, status}``, ``status_code`` being what acting on that job alone would
    have answered: 404 not visible to ``by``, 403 not theirs to act on, 400 refused (e.g. ended already), 409
    changed meanwhile, 500 failed (logged; the others are still tried)."""
    from . import selectors

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
