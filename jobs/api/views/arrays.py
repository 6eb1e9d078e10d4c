"""The arrays resource: list and show arrays and sweeps with their members' counts per phase, cancel, stop or
restart the failed members of one; and the array submit (``POST /jobs/`` with ``array`` or ``sweep``), answered
with the array from its own transaction."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from django.http import Http404
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse

from jobs import array_selectors, services
from jobs.models import JobArray
from jobs.services.arrays import array_act, array_plan_validate, array_submit

from ..exceptions import validation_error_from_django
from ..pagination import JobPagination
from ..serializers.arrays import ArrayDetailSerializer, ArraySerializer
from ..serializers.job_writes import JobSubmitSerializer
from .base import ApiMixin


class CanActOnArray(permissions.BasePermission):
    """Reading needs visibility only (the queryset); acting needs the single job's rule on its members."""

    message = services.CANNOT_ACT

    def has_object_permission(self, request: Request, view, obj: JobArray) -> bool:
        return request.method in permissions.SAFE_METHODS or array_selectors.array_can_act(request.user, obj)


def array_data(array: JobArray, *, request: Request) -> dict:
    """The array resource with its counts and members, read now (two queries)."""
    context = {"request": request, "counts": array_selectors.array_counts([array.pk]),
               "members": array_selectors.array_members(array)}
    return ArrayDetailSerializer(array, context=context).data


def created_array_data(array: JobArray, *, request: Request) -> dict:
    """The resource of an array this request has just made, from the objects in hand (no query)."""
    members = array.created_members
    counts: dict[str, int] = {}
    for job in members:
        counts[job.phase] = counts.get(job.phase, 0) + 1
    rows = [{"id": j.pk, "name": j.name, "array_index": j.array_index, "array_params": j.array_params,
             "phase": j.phase, "status": j.status, "reason": j.reason} for j in members]
    return ArrayDetailSerializer(array, context={"request": request, "counts": {array.pk: counts},
                                                 "members": rows}).data


def array_submit_answer(request: Request, *, key: str, fingerprint: str) -> Response:
    """``POST /jobs/`` with ``array`` or ``sweep``: validate the spec once, make the array and its members, answer
    201 with the array, serialized in the transaction that made it. A concurrent submit with the same key that
    committed first raises ``services.SubmitKeyTaken`` (the caller answers that one's array)."""
    serializer = JobSubmitSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    data = serializer.validated_data
    user = request.user
    try:
        spec = services.job_spec_validate(user=user, data=data)
        plan = array_plan_validate(spec=spec, array=data.get("array"), sweep=data.get("sweep"))
    except DjangoValidationError as exc:
        raise validation_error_from_django(exc) from exc
    with transaction.atomic():
        array = array_submit(user=user, spec=spec, plan=plan, idempotency_key=key,
                             fingerprint=fingerprint)
        body = created_array_data(array, request=request)
    headers = {"Location": body["url"]}
    if key:
        headers["Idempotent-Replayed"] = "false"
    return Response(body, status=status.HTTP_201_CREATED, headers=headers)


def array_replay_answer(array: JobArray, *, request: Request) -> Response:
    """A retried array submit (same `Idempotency-Key` and body): the array it made, as it is now."""
    return Response(array_data(array, request=request), status=status.HTTP_201_CREATED,
                    headers={"Location": reverse("api:array-detail", kwargs={"pk": array.pk}, request=request),
                             "Idempotent-Replayed": "true"})


ACTION_SUMMARIES = {
    "cancel": "Cancel every member of an array that has not ended",
    "stop": "Stop every member of an array that has not ended (restartable, status Stopped)",
    "restart-failed": "Restart the failed members of an array, each as a new attempt",
}


@extend_schema_view(
    list=extend_schema(summary="List arrays and sweeps",
                       description="Arrays of your groups (all for superusers), newest first, each with its "
                                   "members' counts per phase (members are in the detail). Paged like the job "
                                   "list (`page` or `cursor`)."),
    retrieve=extend_schema(summary="Show an array with its members in index order"),
)
@extend_schema(tags=["arrays"])
class ArrayViewSet(ApiMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Arrays and sweeps: one submission's member jobs, shown and acted on together."""

    permission_classes = [permissions.IsAuthenticated, CanActOnArray]
    pagination_class = JobPagination
    filter_backends: list = []
    serializer_class = ArraySerializer
    queryset = JobArray.objects.none()  # for the schema; requests use get_queryset

    def get_queryset(self):
        return array_selectors.arrays_visible_to(self.request.user)

    def get_serializer_class(self):
        return ArraySerializer if self.action == "list" else ArrayDetailSerializer

    def get_object(self) -> JobArray:
        try:
            return super().get_object()
        except Http404:
            raise exceptions.NotFound(f"No array {self.kwargs.get('pk', '')!s:.30} in your groups.") from None

    def list(self, request: Request) -> Response:
        page = list(self.paginate_queryset(self.get_queryset()))
        context = {"request": request, "counts": array_selectors.array_counts(a.pk for a in page)}
        return self.get_paginated_response(ArraySerializer(page, many=True, context=context).data)

    def retrieve(self, request: Request, pk: str | None = None) -> Response:
        return Response(array_data(self.get_object(), request=request))

    def _act(self, name: str) -> Response:
        array = self.get_object()  # 404 when invisible, 403 when not allowed to act
        with transaction.atomic():  # nothing to act on: a 400 (ValidationError); the answer read before the commit
            array_act(array=array, by=self.request.user, action=name)
            data = array_data(array, request=self.request)
        return Response(data)

    @extend_schema(summary=ACTION_SUMMARIES["cancel"], request=None, responses={200: ArrayDetailSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        return self._act("cancel")

    @extend_schema(summary=ACTION_SUMMARIES["stop"], request=None, responses={200: ArrayDetailSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        return self._act("stop")

    @extend_schema(summary=ACTION_SUMMARIES["restart-failed"], request=None, responses={200: ArrayDetailSerializer})
    @action(detail=True, methods=["post"], url_path="restart-failed", url_name="restart-failed")
    def restart_failed(self, request: Request, pk: str | None = None) -> Response:
        return self._act("restart-failed")
