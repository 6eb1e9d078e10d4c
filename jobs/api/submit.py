"""The job API's writes answered from their own transaction, and the `Idempotency-Key` of a submit.

A submit, clone, restart, cancel or stop serializes its answer inside the transaction that writes the job, from
what that transaction holds, before the commit (a new job written in one statement: right after it, from the
objects in hand). Nothing is read after the commit, so a database connection lost right after it (a restart, a
failover, ``pg_terminate_backend``) cannot turn a saved job into a 500, nor the client's retry of that 500 into a
second job. What runs after the commit (``transaction.on_commit``: the live
update, the scheduler's wake-up) never raises.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import exceptions, status
from rest_framework.request import Request

from jobs import services
from jobs.models import Attempt, Job

from .exceptions import validation_error_from_django
from .serializers.fields import validated
from .serializers.job_writes import JobSubmitSerializer

IDEMPOTENCY_KEY_MAX = 255
IDEMPOTENCY_KEY_PARAM = OpenApiParameter(
    "Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
    description=f"Makes a retried submit safe: 1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters, new for each "
                "job (a UUID). The same key and body from the same user within 24 hours answer the first job; the "
                "answer then has `Idempotent-Replayed: true`.",
)


class IdempotencyKeyReused(exceptions.APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = "The Idempotency-Key was used for another request body; send a new key for a new job."
    default_code = "idempotency_key_reused"


def idempotency_key(request: Request) -> str:
    """The request's `Idempotency-Key` ("" without one); 400 when it is empty, too long or not printable ASCII."""
    key = request.headers.get("Idempotency-Key", "").strip()
    if "Idempotency-Key" in request.headers and not (
        0 < len(key) <= IDEMPOTENCY_KEY_MAX and key.isascii() and key.isprintable()
    ):
        raise exceptions.ValidationError(
            {"Idempotency-Key": [f"Send 1 to {IDEMPOTENCY_KEY_MAX} printable ASCII characters (a UUID)."]}
        )
    return key


def fingerprint(data: Any) -> str:
    """The request body as canonical JSON, hashed: the same job spec as JSON or YAML has one fingerprint."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def submitted_with(*, user: AbstractBaseUser, key: str, fingerprint: str) -> Job | None:
    """The job an earlier submit of ``user`` with this key made, or None; 422 when that submit had another body."""
    try:
        return services.job_submitted_with(user=user, key=key, fingerprint=fingerprint)
    except services.SubmitKeyReused as exc:
        raise IdempotencyKeyReused(" ".join(exc.messages)) from exc


def job_spec_checked(*, user: AbstractBaseUser, data: Any) -> services.JobSpec:
    """The body of a submit (or clone) as a spec the group's rules allow; a 400 naming each field otherwise.
    Reads only: nothing is written when it fails."""
    spec = validated(JobSubmitSerializer, data)
    try:
        return services.job_spec_validate(user=user, data=spec)
    except DjangoValidationError as exc:
        raise validation_error_from_django(exc) from exc


def answered(write: Callable[[], Job], serialize: Callable[[Job], dict[str, Any]], *,
             one_statement: bool = False) -> tuple[Job, dict[str, Any]]:
    """Run ``write`` and ``serialize`` the job it returns in one transaction: the answer is complete before the
    commit, and an error while building it rolls the write back (nothing saved, so a retry is safe). A write that
    is ``one_statement`` (a new job: ``services.job_submit_is_one_statement``) is its own transaction; its answer,
    built from the objects in hand, reads nothing, so nothing after that commit can fail for the database."""
    if one_statement:
        job = write()
        return job, serialize(job)
    with transaction.atomic():
        job = write()
        data = serialize(job)
    return job, data


def as_created(job: Job) -> Job:
    """A job this request has just created, ready to serialize without reading it back: it has no attempts yet (as
    prefetching leaves nothing: a queryset with its empty result in hand, which compiles no SQL when iterated, as an
    empty queryset would to find it has nothing to run); its group, user, image and instance type are the objects it
    was made with."""
    attempts = Attempt.objects.none()
    attempts._result_cache, attempts._prefetch_done = [], True
    job._prefetched_objects_cache = {"attempts": attempts}
    return job
