"""Submitting a job: the checks of a submission against the user's groups, images, instance types and quotas
(``job_spec_validate``), the job's creation (``job_submit``) and the `Idempotency-Key` that makes a retried submit
answer the job it made (``job_submitted_with``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from .. import limits, live_publisher, prepared_submit
from ..choices import EventType, JobType, Phase, Priority, Resource
from ..dependencies import After
from ..models import Group, GroupQuota, Image, InstanceType, Job, JobEvent, SubmitKey
from ..ports import ports_problems
from ..prepared_writes import insert
from ..rules import QuotaLimits, fmt_amount
from ..wakeup import request_admission
from .dependencies import after_problems, dependencies_record
from .events import event_record
from .submit_lookups import lookups


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
    after: tuple[After, ...] = ()  # what it waits for (jobs.dependencies), checked against what the user sees
    ports: tuple[dict, ...] = ()  # what it serves through the site (jobs.ports)


def _quota_problem(group: Group, quotas: tuple[GroupQuota, ...], instance_type: InstanceType, replicas: int,
                   preemptible: bool) -> str | None:
    """Why a request can never fit the group's quotas (a preemptible job may borrow up to the limit), or None."""
    request = instance_type.request
    for q in quotas:
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
    image and instance_type. Raises ``ValidationError`` with a message per field. The group, the user's
    memberships, the image and the instance type come from ``submit_lookups`` (no query when they are kept).
    """
    errors: dict[str, str] = {}
    known = lookups()

    group_name = data.get("group") or ""
    group, member = known.group(group_name, user.pk)
    if group is None:
        errors["group"] = f"Unknown group '{group_name}'."
    elif not (user.is_superuser or member):
        errors["group"] = f"You are not a member of group '{group_name}'."
        group = None
    group_id = group.pk if group else None

    image_name = data.get("image") or ""
    image, allowed = known.image(image_name, group_id)
    if image is None:
        errors["image"] = f"Unknown image '{image_name}'."
    elif group and not allowed:
        errors["image"] = f"Image '{image_name}' is not allowed in group '{group.name}'."

    it_name = data.get("instance_type") or ""
    instance_type, allowed = known.instance_type(it_name, group_id)
    if instance_type is None:
        errors["instance_type"] = f"Unknown instance type '{it_name}'."
    elif group and not allowed:
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
        problem = _quota_problem(group, known.quotas(group.pk), instance_type, replicas, bool(data.get("preemptible")))
        if problem:
            errors["replicas" if replicas > 1 else "instance_type"] = f"This job can never run: it {problem}."

    after, after_errors = after_problems(user=user, value=data.get("after"))
    ports, port_errors = ports_problems(data.get("ports"))
    messages = {k: [v] for k, v in errors.items()}
    if after_errors:
        messages["after"] = after_errors
    if port_errors:
        messages["ports"] = port_errors
    if messages:
        raise ValidationError(messages)

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
        after=after,
        ports=tuple(ports),
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


def job_from_spec(spec: JobSpec, *, user: AbstractBaseUser, now: datetime, **fields: Any) -> Job:
    """An unsaved job of ``spec`` for ``user``, submitted and queued at ``now``; ``fields`` over it (an array
    member's name, environment and place in its array)."""
    it = spec.instance_type
    values: dict[str, Any] = dict(
        name=spec.name, group=spec.group, user=user, image=spec.image, image_url=spec.image.url, instance_type=it,
        gpu=it.gpu, cpu_millicores=it.cpu_millicores, memory_bytes=it.memory_bytes, command=spec.command,
        env=spec.env, replicas=spec.replicas, job_type=spec.job_type, priority=spec.priority,
        preemptible=spec.preemptible, backoff_limit=spec.backoff_limit,
        active_deadline_seconds=spec.active_deadline_seconds,
        ttl_seconds_after_finished=spec.ttl_seconds_after_finished, ports=list(spec.ports), phase=Phase.SUBMITTED,
        status="Submitted", queued_at=now,
    )
    return Job(**{**values, **fields})


def submit_key_record(*, user: AbstractBaseUser, key: str, fingerprint: str, job: Job, now: datetime) -> None:
    """Keep the `Idempotency-Key` of a submit, pointing at ``job``, in one statement and no savepoint: an insert
    that takes the place of the same key's expired row, if any; ``SubmitKeyTaken`` when another submit holds the
    key (it waits for that submit's commit: the unique constraint decides). The user's other expired keys go in
    the same statement on PostgreSQL (a statement before it elsewhere). Raising leaves the caller's transaction
    to roll back (the job written before it)."""
    at, expired_before = (connection.ops.adapt_datetimefield_value(t) for t in (now, now - SUBMIT_KEY_TTL))
    delete, upsert = prepared_submit.key_statements(connection, job_id="%s", returning="id")
    values = [user.pk, key, fingerprint, job.pk, at, expired_before]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"WITH expired AS ({delete}) {upsert}", [user.pk, expired_before, key, *values])
        else:
            cursor.execute(delete, [user.pk, expired_before, key])
            cursor.execute(upsert, values)
        if cursor.fetchone() is None:
            raise SubmitKeyTaken(key)


def job_submit(*, user: AbstractBaseUser, spec: JobSpec, idempotency_key: str = "", fingerprint: str = "") -> Job:
    """Create a job from a validated spec: the job, its event (and the `Idempotency-Key`, and what it waits for,
    when given). With ``idempotency_key`` the key is recorded with the job in the same transaction; a concurrent
    submit that recorded the same key first makes this one raise ``SubmitKeyTaken`` (the unique constraint decides,
    not a check before the insert) and it writes nothing.

    A job that waits for nothing is written in one statement on PostgreSQL (``prepared_submit``), in the caller's
    transaction when there is one, else as its own. Otherwise the writes go one by one in the caller's transaction
    (no savepoint of its own: an error spoils it, so a caller that goes on after one wraps the call in
    ``transaction.atomic()``), or in one of their own. The new job carries its dependencies
    (``dependencies_recorded``) and, when it waits for nothing, its one event (``events_recorded``): the answer is
    built from them, not read back."""
    now = timezone.now()
    job = job_from_spec(spec, user=user, now=now)
    message = f"Submitted by {user.get_username()} to {spec.group.name}"
    if not job_submit_is_one_statement(spec):
        return _job_written_in_steps(job, user=user, spec=spec, idempotency_key=idempotency_key,
                                     fingerprint=fingerprint, message=message, now=now)
    event = JobEvent(job=job, type=EventType.NORMAL, reason="Submitted", message=message)
    if not prepared_submit.write(job, event, key=idempotency_key, fingerprint=fingerprint, now=now,
                                 expired_before=now - SUBMIT_KEY_TTL):
        raise SubmitKeyTaken(idempotency_key)
    job.dependencies_recorded, job.events_recorded = [], [event]
    transaction.on_commit(lambda: live_publisher.publish_job_changes([job.pk]), robust=True)  # the list shows it
    transaction.on_commit(request_admission, robust=True)  # then a pass queues it; no sync round
    return job


def job_submit_is_one_statement(spec: JobSpec) -> bool:
    """Whether ``job_submit`` writes this spec's job in one statement (a transaction of its own, outside one): a
    job that waits for nothing, on PostgreSQL (``prepared_submit.usable``)."""
    return not spec.after and prepared_submit.usable()


@transaction.atomic(savepoint=False)
def _job_written_in_steps(job: Job, *, user: AbstractBaseUser, spec: JobSpec, idempotency_key: str,
                          fingerprint: str, message: str, now: datetime) -> Job:
    insert(job)
    if idempotency_key:
        submit_key_record(user=user, key=idempotency_key, fingerprint=fingerprint, job=job, now=now)
    # The event publishes the new job after commit (the list shows it); then a pass queues it.
    event = event_record(job=job, reason="Submitted", message=message)
    if spec.after:
        # Waits PENDING (reason Dependency) while one is not met; the rows stay in hand for the answer (its events,
        # the wait's among them, are read).
        job.dependencies_recorded = dependencies_record(jobs=[job], after=spec.after, user=user, now=now)
    else:
        job.dependencies_recorded, job.events_recorded = [], [event]
    transaction.on_commit(request_admission, robust=True)  # a pass; no sync round
    return job
