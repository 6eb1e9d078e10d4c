"""The jobs resource's writes: submit, clone, cancel, stop, restart and bulk cancel, each one ``jobs.services``
call whose job is answered from its own transaction (``jobs.api.submit``)."""

from __future__ import annotations

from collections.abc import Callable

from drf_spectacular.utils import OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import exceptions, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse

from jobs import selectors, services
from jobs.models import Job

from .. import submit
from ..exceptions import Conflict
from ..schema import ErrorSerializer
from ..serializers.arrays import ArrayDetailSerializer
from ..serializers.fields import represented
from ..serializers.job_writes import (
    BulkCancelResponseSerializer,
    BulkCancelSerializer,
    JobCloneSerializer,
    JobSubmitSerializer,
)
from ..serializers.jobs import JobDetailSerializer
from .arrays import array_replay_answer, array_submit_answer
from .query_params import VOCABULARY_PARAM, vocabulary_param


class JobActionsMixin:
    """The writes of ``JobViewSet``: ``POST /jobs/``, ``/jobs/{id}/{clone,cancel,stop,restart}/``, ``/jobs/cancel/``."""

    def _detail(self, job: Job, *, status_code: int = status.HTTP_200_OK, **kw) -> Response:
        job = self.get_queryset().get(pk=job.pk)
        return Response(JobDetailSerializer(job, context=self.get_serializer_context()).data, status=status_code,
                        **kw)

    def _answer(self, write: Callable[[], Job], *, created: bool = False, headers: dict | None = None,
                one_statement: bool = False) -> Response:
        """``write``'s job, serialized in its transaction (``submit.answered``; ``one_statement``: a new job
        written in one statement, its own transaction): a new job (``created``, 201) from the objects in hand, a
        changed one read again as the detail shows it. Nothing is read after the commit."""
        context = self.get_serializer_context()

        def serialize(job: Job) -> dict:
            job = submit.as_created(job) if created else self.get_queryset().get(pk=job.pk)
            return represented(JobDetailSerializer, job, context)

        job, data = submit.answered(write, serialize, one_statement=one_statement)
        if created:
            headers = {"Location": reverse("api:job-detail", kwargs={"pk": job.pk}, request=self.request),
                       **(headers or {})}
        return Response(data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK, headers=headers)

    @extend_schema(
        summary="Submit a job",
        description="A JSON object, or the same fields as a YAML document (`Content-Type: application/yaml`). "
                    "Unknown fields, wrong types and rules of the group (membership, images, instance types, "
                    "quotas) answer 400 naming each field; nothing is written then.\n\n"
                    "With an `Idempotency-Key` header a retried submit is safe: the same key with the same body "
                    "from the same user within 24 hours answers the job the first one made (201, its current "
                    "detail, `Idempotent-Replayed: true`) instead of making another; the same key with another "
                    "body is a 422. Keys are per user.\n\n"
                    "With `array` (indices, e.g. `0-99%8`) or `sweep` (a grid, e.g. `{\"lr\": [0.0001, 0.0003]}`) "
                    "one submit makes an array of member jobs in one transaction and answers 201 with the array "
                    "(`ArrayDetail`: its members in index order, each with its `id`).",
        request=JobSubmitSerializer,
        parameters=[submit.IDEMPOTENCY_KEY_PARAM],
        responses={201: PolymorphicProxySerializer("SubmitAnswer", [JobDetailSerializer, ArrayDetailSerializer],
                                                   resource_type_field_name=None),
                   422: OpenApiResponse(ErrorSerializer,
                                        description="The Idempotency-Key was used with another request body.")},
    )
    def create(self, request: Request, *args, **kwargs) -> Response:
        self._vocabulary_checked()
        user, key = request.user, submit.idempotency_key(request)
        fingerprint = submit.fingerprint(request.data) if key else ""
        if isinstance(request.data, dict) and ("array" in request.data or "sweep" in request.data):
            return self._create_array(request, key=key, fingerprint=fingerprint)
        # A job: no look-up of the key first. A new key is recorded with the job; a key taken already (a retry)
        # rolls that back, and so does a spec refused now, then the key's job is answered.
        try:
            spec = submit.job_spec_checked(user=user, data=request.data)
        except exceptions.ValidationError:
            job = submit.submitted_with(user=user, key=key, fingerprint=fingerprint) if key else None
            if job is None:
                raise
            return self._replayed(job)
        try:
            return self._answer(lambda: services.job_submit(user=user, spec=spec, idempotency_key=key,
                                                            fingerprint=fingerprint),
                                created=True, headers={"Idempotent-Replayed": "false"} if key else None,
                                one_statement=services.job_submit_is_one_statement(spec))
        except services.SubmitKeyTaken:
            return self._replayed(self._key_holder(user=user, key=key, fingerprint=fingerprint))

    def _create_array(self, request: Request, *, key: str, fingerprint: str) -> Response:
        user = request.user
        job = submit.submitted_with(user=user, key=key, fingerprint=fingerprint) if key else None
        if job is None:
            try:
                return array_submit_answer(request, key=key, fingerprint=fingerprint)
            except services.SubmitKeyTaken:
                job = self._key_holder(user=user, key=key, fingerprint=fingerprint)
        return self._replayed(job)

    @staticmethod
    def _key_holder(*, user, key: str, fingerprint: str) -> Job:
        """The job of the submit that holds ``key`` (it committed first); 409 when it has not committed yet."""
        job = submit.submitted_with(user=user, key=key, fingerprint=fingerprint)
        if job is None:
            raise Conflict("A submit with the same Idempotency-Key is in progress; try again.")
        return job

    def _replayed(self, job: Job) -> Response:
        """A retried submit: what the first one made (the array, for an array member), as it is now."""
        if job.array_id is not None:
            return array_replay_answer(job.array, request=self.request)
        location = reverse("api:job-detail", kwargs={"pk": job.pk}, request=self.request)
        return self._detail(job, status_code=status.HTTP_201_CREATED,
                            headers={"Location": location, "Idempotent-Replayed": "true"})

    def _vocabulary_checked(self) -> None:
        vocabulary_param(self.request)  # a bad ?vocabulary= is a 400 before anything is written

    @extend_schema(summary="Clone a job: submit its spec again as a new job of yours",
                   description="The body may change some fields (an empty body clones as is); the spec is validated "
                               "again against the group's current rules.",
                   request=JobCloneSerializer, responses={201: JobDetailSerializer}, parameters=[VOCABULARY_PARAM])
    @action(detail=True, methods=["post"])
    def clone(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        self._vocabulary_checked()
        changes = JobCloneSerializer(data=request.data if request.data else {})
        changes.is_valid(raise_exception=True)
        data = {**selectors.job_spec_of(job), **{k: request.data[k] for k in changes.validated_data}}
        spec = submit.job_spec_checked(user=request.user, data=data)
        return self._answer(lambda: services.job_submit(user=request.user, spec=spec), created=True,
                            one_statement=services.job_submit_is_one_statement(spec))

    @extend_schema(summary="Cancel a job", request=None, responses={200: JobDetailSerializer},
                   parameters=[VOCABULARY_PARAM])
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()  # 404 when invisible, 403 when not allowed to act
        self._vocabulary_checked()
        return self._answer(lambda: services.job_cancel(job=job, by=request.user))  # already ended → 400

    @extend_schema(summary="Stop a job (a cancel that can be restarted: status Stopped)", request=None,
                   responses={200: JobDetailSerializer}, parameters=[VOCABULARY_PARAM])
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        self._vocabulary_checked()
        return self._answer(lambda: services.job_cancel(job=job, by=request.user, stop=True))

    @extend_schema(summary="Restart an ended job from the beginning, as a new attempt of the same job",
                   request=None, responses={200: JobDetailSerializer}, parameters=[VOCABULARY_PARAM])
    @action(detail=True, methods=["post"])
    def restart(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        self._vocabulary_checked()
        return self._answer(lambda: services.job_restart(job=job, by=request.user))  # running / succeeded → 400

    @extend_schema(
        summary="Cancel several jobs",
        operation_id="jobs_bulk_cancel",
        description="Each id is tried on its own: the answer reports per id what happened (`status_code` is what "
                    "cancelling that job alone would have answered). Jobs you may not see are reported as 404.",
        request=BulkCancelSerializer, responses={200: BulkCancelResponseSerializer},
    )
    @action(detail=False, methods=["post"], url_path="cancel", url_name="bulk-cancel")
    def bulk_cancel(self, request: Request) -> Response:
        body = BulkCancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        results = services.job_cancel_many(ids=body.validated_data["ids"], by=request.user,
                                           stop=body.validated_data["stop"])
        cancelled = sum(1 for r in results if r["ok"])
        return Response({"ok": cancelled == len(results), "cancelled": cancelled,
                         "failed": len(results) - cancelled, "results": results})
