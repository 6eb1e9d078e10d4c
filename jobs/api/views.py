"""The REST API: thin views over ``jobs.selectors`` (reads) and ``jobs.services`` (writes).

Visibility: a job of a group the user is not in does not exist for them (404). Acting on a visible job that is
neither theirs nor in a group they administer is forbidden (403).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpResponse, StreamingHttpResponse
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import exceptions, mixins, permissions, renderers, status, viewsets
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse

from jobs import logs, selectors, services
from jobs.filtersets import JobFilterSet
from jobs.models import Job

from .exceptions import RequestTooLarge, exception_handler, validation_error_from_django
from .pagination import JobPagination
from .parsers import JSONParser
from .serializers import JobDetailSerializer, JobSerializer, JobSubmitSerializer

MAX_BODY_BYTES = 1 << 20
TEXT_PLAIN = "text/plain; charset=utf-8"


class PlainTextRenderer(renderers.BaseRenderer):
    """Errors of the logs action as text, for clients that accept only text/plain (logs themselves are sent as is)."""

    media_type = "text/plain"
    format = "txt"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        if data is None:
            return b""
        if isinstance(data, bytes):
            return data
        if isinstance(data, dict):
            lines = []
            for key, value in data.items():
                text = " ".join(str(v) for v in value) if isinstance(value, list) else str(value)
                lines.append(text if key == "detail" else f"{key}: {text}")
            return ("\n".join(lines) + "\n").encode()
        return str(data).encode()


class CanActOnJob(permissions.BasePermission):
    """Reading needs visibility only (the queryset); changing a job needs ``selectors.job_can_act``."""

    message = "You can act only on your own jobs and on the jobs of groups you administer."

    def has_object_permission(self, request: Request, view, obj: Job) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        return selectors.job_can_act(request.user, obj)


class ApiMixin:
    """What every jobsite API view shares: Django ValidationErrors from services are 400s, never 500s."""

    def get_exception_handler(self):
        return exception_handler


class TokenObtainApi(ApiMixin, ObtainAuthToken):
    """``POST {username, password}`` → ``{"token": ...}``; bad credentials → 400 with a message."""


class JobViewSet(ApiMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Submit, list, show, read logs of and cancel jobs."""

    permission_classes = [permissions.IsAuthenticated, CanActOnJob]
    pagination_class = JobPagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = JobFilterSet
    parser_classes = [JSONParser]
    serializer_class = JobSerializer

    def get_queryset(self):
        return selectors.jobs_visible_to(self.request.user).select_related("current_attempt").order_by("-id")

    def get_serializer_class(self):
        if self.action == "create":
            return JobSubmitSerializer
        if self.action == "list":
            return JobSerializer
        return JobDetailSerializer

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        # Before the body is read: a client may not make the server buffer more than 1 MiB.
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > MAX_BODY_BYTES:
            raise RequestTooLarge(f"The request body is {length} bytes; at most {MAX_BODY_BYTES} are accepted.")

    def create(self, request: Request, *args, **kwargs) -> Response:
        serializer = JobSubmitSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            spec = services.job_spec_validate(user=request.user, data=serializer.validated_data)
        except DjangoValidationError as exc:
            raise validation_error_from_django(exc) from exc
        job = services.job_submit(user=request.user, spec=spec)
        location = reverse("api:job-detail", kwargs={"pk": job.pk}, request=request)
        return Response(JobDetailSerializer(job).data, status=status.HTTP_201_CREATED, headers={"Location": location})

    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()  # 404 when invisible, 403 when not allowed to act
        services.job_cancel(job=job, by=request.user)  # ValidationError (already ended) → 400
        return Response(JobDetailSerializer(self.get_queryset().get(pk=job.pk)).data)

    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        """A cancel that can be restarted: the job ends CANCELLED with status Stopped."""
        job = self.get_object()
        services.job_cancel(job=job, by=request.user, stop=True)
        return Response(JobDetailSerializer(self.get_queryset().get(pk=job.pk)).data)

    @action(detail=True, methods=["post"])
    def restart(self, request: Request, pk: str | None = None) -> Response:
        """Run an ended job again from the beginning, as a new attempt of the same job."""
        job = self.get_object()
        services.job_restart(job=job, by=request.user)  # still running / succeeded → 400
        return Response(JobDetailSerializer(self.get_queryset().get(pk=job.pk)).data)

    @action(detail=True, methods=["get"], renderer_classes=[renderers.JSONRenderer, PlainTextRenderer])
    def logs(self, request: Request, pk: str | None = None) -> HttpResponse:
        """``?replica=N`` (default 0), ``?attempt=M`` (default current), ``?tail_bytes=K``: text/plain."""
        job = self.get_object()
        replica = _int_param(request, "replica", default=0)
        attempt_number = _int_param(request, "attempt", default=None)
        tail_bytes = _int_param(request, "tail_bytes", default=None)

        if attempt_number is None:
            attempt = job.current_attempt
        else:
            attempt = job.attempts.filter(number=attempt_number).first()
            if attempt is None:
                raise exceptions.NotFound(f"Job #{job.pk} has no attempt {attempt_number}.")
        replicas = attempt.replicas if attempt else job.replicas
        if not 0 <= replica < replicas:
            raise exceptions.NotFound(f"Replica {replica} does not exist: the job has replicas 0 to {replicas - 1}.")
        if attempt is None:  # not admitted yet: no log so far
            return HttpResponse(b"", content_type=TEXT_PLAIN)

        from scheduler.backends import get_backend

        try:
            get_backend(attempt.backend)
        except ValueError as exc:
            raise exceptions.NotFound(f"The logs of backend '{attempt.backend}' are not available here.") from exc
        # The file may grow while it is sent: send what it held when opened.
        content = logs.open_slice(logs.log_path(attempt, replica), tail_bytes=tail_bytes)
        if content is None:
            return HttpResponse(b"", content_type=TEXT_PLAIN)
        response = StreamingHttpResponse(content, content_type=TEXT_PLAIN)
        response["Cache-Control"] = "no-store"
        return response


def _int_param(request: Request, name: str, *, default: int | None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise exceptions.ValidationError({name: ["Give a whole number."]}) from None
    if value < 0:
        raise exceptions.ValidationError({name: ["Give a number of at least 0."]})
    return value
