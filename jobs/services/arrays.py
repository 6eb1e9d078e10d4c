"""Arrays and sweeps: one submission making a JobArray and all its member jobs in one transaction and a bounded
number of queries (``array_submit``), and what a user does to a whole array (``array_act``: cancel, stop, restart
the failed members), each member through the single job's service.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from .. import limits
from ..arrays import ArrayError, ArrayPlan, array_plan, member_env, member_name
from ..choices import TERMINAL_PHASES, EventType, Phase
from ..models import Job, JobArray, JobEvent
from ..state_machine import InvalidTransition
from ..wakeup import request_admission
from .actions import job_cancel, job_restart
from .dependencies import dependencies_record
from .submission import JobSpec, job_from_spec, submit_key_record

log = logging.getLogger(__name__)


def array_plan_validate(*, spec: JobSpec, array: str | None, sweep: Any) -> ArrayPlan:
    """The members a submission's ``array`` / ``sweep`` make with the job spec ``spec``; ``ValidationError`` with a
    message per field otherwise."""
    try:
        plan = array_plan(array=array, sweep=sweep)
    except ArrayError as exc:
        raise ValidationError({exc.field: [exc.message]}) from exc
    if len(spec.env) + len(plan.sweep) > limits.ENV_MAX_VARS:
        raise ValidationError({"sweep": [f"The job's variables and the sweep's are more than {limits.ENV_MAX_VARS}."]})
    return plan


def array_submit(*, user: AbstractBaseUser, spec: JobSpec, plan: ArrayPlan, idempotency_key: str = "",
                 fingerprint: str = "") -> JobArray:
    """Create the array and its members from a validated spec and plan: one INSERT of the array, one of all its
    members, one of their "Submitted" events (and the `Idempotency-Key`, pointing at the first member, when
    given). Every member waits for what ``spec.after`` names (``dependencies_record``). The members are on the
    returned array as ``array.created_members`` (in index order), for an answer built without reading them back.

    In the caller's transaction when there is one (no savepoint of its own), else in its own."""
    with transaction.atomic(savepoint=False):
        now = timezone.now()
        array = JobArray.objects.create(name=spec.name, group=spec.group, user=user, indices=plan.text,
                                        sweep=plan.sweep, size=plan.size, max_running=plan.max_running)
        members = [
            job_from_spec(spec, user=user, now=now, name=member_name(spec.name, index, params),
                          env=member_env(spec.env, array.pk, index, params), array=array, array_index=index,
                          array_params=params)
            for index, params in zip(plan.indices, plan.params, strict=True)
        ]
        Job.objects.bulk_create(members, batch_size=5000)
        who = user.get_username()
        JobEvent.objects.bulk_create([
            JobEvent(job=job, type=EventType.NORMAL, reason="Submitted",
                     message=f"Submitted by {who} to {spec.group.name}, member {job.array_index} of array {array.pk}")
            for job in members
        ], batch_size=5000)
        if spec.after:
            dependencies_record(jobs=members, after=spec.after, user=user, now=now)
        if idempotency_key:
            submit_key_record(user=user, key=idempotency_key, fingerprint=fingerprint, job=members[0], now=now)
        ids = [job.pk for job in members]

        def published() -> None:
            from ..live_publisher import publish_job_changes

            publish_job_changes(ids)

        transaction.on_commit(published, robust=True)
        transaction.on_commit(request_admission, robust=True)
    array.created_members = members
    return array


# What each array action does to the members it applies to.
ACTIONS = {
    "cancel": ("cancel", lambda job: job.phase not in TERMINAL_PHASES),
    "stop": ("stop", lambda job: job.phase not in TERMINAL_PHASES),
    "restart-failed": ("restart", lambda job: job.phase == Phase.FAILED),
}


def array_act(*, array: JobArray, by: AbstractBaseUser, action: str) -> dict[str, int]:
    """Cancel, stop or restart the failed members of ``array`` (``action``: a key of ``ACTIONS``), each through
    ``job_cancel`` / ``job_restart`` in its own savepoint; a member that changed meanwhile (ended, restarted) is
    left as it is. Whether ``by`` may act on the array is the caller's check (the single job's rule).
    Returns {"done": n, "skipped": n}; ``ValidationError`` when no member applies."""
    verb, applies = ACTIONS[action]
    with transaction.atomic():
        members = [job for job in Job.objects.filter(array=array).order_by("array_index") if applies(job)]
        if not members:
            what = "failed member to restart" if verb == "restart" else f"member left to {verb}"
            raise ValidationError(f"Array {array.pk} has no {what}.")
        done = 0
        for job in members:
            try:
                with transaction.atomic():
                    if verb == "restart":
                        job_restart(job=job, by=by)
                    else:
                        job_cancel(job=job, by=by, stop=verb == "stop")
                done += 1
            except (ValidationError, InvalidTransition) as exc:
                log.info("array %s: member #%s left as it is: %s", array.pk, job.pk, exc)
    return {"done": done, "skipped": len(members) - done}
