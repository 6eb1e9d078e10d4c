"""The jobs resource: list and show jobs, their events and attempts; the writes and the logs come from the mixins of
``job_actions`` and ``job_logs``."""

from __future__ import annotations

from django.http import Http404
from django_filters.rest_framework import DjangoFilterBackend
from django_filters.utils import translate_validation
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, permissions, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from jobs import selectors, services
from jobs.filtersets import JobFilterSet
from jobs.models import Job

from ..pagination import JobPagination
from ..parsers import JSONParser, TextYAMLParser, XYAMLParser, YAMLParser
from ..serializers.job_writes import JobSubmitSerializer
from ..serializers.jobs import AttemptDetailSerializer, EventSerializer, JobDetailSerializer, JobSerializer
from .base import ApiMixin
from .job_actions import JobActionsMixin
from .job_logs import JobLogsMixin
from .query_params import VOCABULARY_PARAM, vocabulary_param


class CanActOnJob(permissions.BasePermission):
    """Reading and cloning need visibility only (the queryset); changing a job needs ``selectors.job_can_act``."""

    message = services.CANNOT_ACT

    def has_object_permission(self, request: Request, view, obj: Job) -> bool:
        if request.method in permissions.SAFE_METHODS or getattr(view, "action", None) == "clone":
            return True
        return selectors.job_can_act(request.user, obj)


@extend_schema_view(
    list=extend_schema(summary="List jobs", parameters=[VOCABULARY_PARAM],
                       description="Jobs of your groups (all for superusers), newest first. Numbered pages "
                                   "(`page`) or keyset pages (`cursor`, as fast at any depth: start with `cursor=` "
                                   "and follow `next`). `count` is exact up to 10,000 jobs and estimated above "
                                   "(`count_exact: false`). `q` matches a name substring or the job id (`123` or "
                                   "`#123`)."),
    retrieve=extend_schema(summary="Show a job with its attempts and events", parameters=[VOCABULARY_PARAM]),
)
@extend_schema(tags=["jobs"])
class JobViewSet(ApiMixin, JobActionsMixin, JobLogsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                 viewsets.GenericViewSet):
    """Submit, list, show, follow and act on jobs."""

    permission_classes = [permissions.IsAuthenticated, CanActOnJob]
    pagination_class = JobPagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = JobFilterSet
    parser_classes = [JSONParser, YAMLParser, TextYAMLParser, XYAMLParser]
    serializer_class = JobSerializer
    queryset = Job.objects.none()  # for the schema; requests use get_queryset

    def get_queryset(self):
        if self.action == "list" and not getattr(self, "swagger_fake_view", False):
            # The same query as the HTML list; filters that are not understood are a 400, as django-filter's.
            jobs, errors = selectors.job_list(self.request.user, self.request.query_params)
            if errors:
                raise translate_validation(errors)
            return jobs
        return selectors.jobs_visible_to(self.request.user).order_by("-id")

    def get_object(self) -> Job:
        try:
            return super().get_object()
        except Http404:
            raise exceptions.NotFound(f"No job {self.kwargs.get('pk', '')!s:.30} in your groups.") from None

    def filter_queryset(self, queryset):
        # The list's filters are in selectors.job_list (filter_backends stay for the schema); they apply to the
        # list only: ?phase= on a detail URL must not make the job vanish.
        return queryset

    def get_serializer_class(self):
        if self.action == "create":
            return JobSubmitSerializer
        if self.action == "list":
            return JobSerializer
        return JobDetailSerializer

    def get_serializer_context(self):
        context = super().get_serializer_context()
        if getattr(self, "request", None) is not None and getattr(self, "swagger_fake_view", False) is False:
            context["vocabulary"] = vocabulary_param(self.request)
        return context

    @extend_schema(summary="A job's events (its `describe`), oldest first", responses={200: EventSerializer(many=True)},
                   filters=False)
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=JobPagination)
    def events(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        page = self.paginate_queryset(selectors.job_events(job))
        return self.get_paginated_response(EventSerializer(page, many=True).data)

    @extend_schema(summary="A job's attempts, with each replica's log size",
                   responses={200: AttemptDetailSerializer(many=True)}, filters=False)
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=JobPagination)
    def attempts(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        page = self.paginate_queryset(job.attempts.order_by("number"))
        return self.get_paginated_response(AttemptDetailSerializer(page, many=True).data)
