"""The REST API: thin views over ``jobs.selectors`` (reads) and ``jobs.services`` (writes).

Visibility: a job or group of a group the user is not in does not exist for them (404). Acting on a visible job
that is neither theirs nor in a group they administer is forbidden (403). Anonymous requests are 401. Errors all
have the shape of ``jobs.api.exceptions``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

from django.http import Http404, HttpResponse, StreamingHttpResponse
from django.utils import timezone
from django_filters.rest_framework import DjangoFilterBackend
from django_filters.utils import translate_validation
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, permissions, renderers, status, viewsets
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from jobs import logs, selectors, services, vocabularies
from jobs.choices import TERMINAL_PHASES
from jobs.filtersets import JobFilterSet
from jobs.models import Attempt, Group, Job

from . import auth, queries, submit
from .exceptions import Conflict, RequestTooLarge, error_body
from .pagination import JobPagination
from .parsers import JSONParser, TextYAMLParser, XYAMLParser, YAMLParser
from .schema import ErrorSerializer
from .serializers import (
    AttemptDetailSerializer,
    BulkCancelResponseSerializer,
    BulkCancelSerializer,
    EventSerializer,
    GroupDetailSerializer,
    GroupSerializer,
    ImageSerializer,
    InstanceTypeSerializer,
    JobCloneSerializer,
    JobDetailSerializer,
    JobSerializer,
    JobSubmitSerializer,
    QueueEntrySerializer,
    UsageSerializer,
    UtilisationSerializer,
    VocabulariesSerializer,
)

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
TEXT_PLAIN = "text/plain; charset=utf-8"
USAGE_MAX_DAYS = 366
USAGE_DEFAULT_DAYS = 30


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
            body = data if "errors" in data else error_body(data)
            lines = [f"{path}: {message}" for path, messages in body["errors"].items() for message in messages]
            lines = lines or [str(body["detail"])]
            return ("\n".join(lines) + "\n").encode()
        return str(data).encode()


class CanActOnJob(permissions.BasePermission):
    """Reading and cloning need visibility only (the queryset); changing a job needs ``selectors.job_can_act``."""

    message = services.CANNOT_ACT

    def has_object_permission(self, request: Request, view, obj: Job) -> bool:
        if request.method in permissions.SAFE_METHODS or getattr(view, "action", None) == "clone":
            return True
        return selectors.job_can_act(request.user, obj)


class ApiMixin:
    """What every jobsite API view shares: bodies of at most 1 MiB, refused before they are read."""

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > MAX_BODY_BYTES:
            raise RequestTooLarge(f"The request body is {length} bytes; at most {MAX_BODY_BYTES} are accepted.")


# --- parameters shared by several operations ----------------------------------------------------------------

COUNT = {"type": "integer", "minimum": 0}

VOCABULARY_PARAM = OpenApiParameter(
    "vocabulary", OpenApiTypes.STR, enum=[*vocabularies.VOCABULARIES, *vocabularies.ALIASES],
    description="Add `vocabulary_status` (and `vocabulary_code` for modelarts) to each job: its status as that "
                "scheduler would show it. See docs/status-vocabularies.md.",
)
GROUP_NAME_PARAM = OpenApiParameter(
    "name", OpenApiTypes.STR, OpenApiParameter.PATH, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    description="Group name.",
)


def _vocabulary(request: Request) -> str | None:
    raw = request.query_params.get("vocabulary")
    if raw is None or raw == "":
        return None
    try:
        return vocabularies.normalise(raw)
    except vocabularies.UnknownVocabulary as exc:
        raise exceptions.ValidationError({"vocabulary": [str(exc)]}) from None


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


def _bool_param(request: Request, name: str) -> bool:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return False
    value = raw.strip().lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise exceptions.ValidationError({name: ["Give true or false."]})


def _date_param(request: Request, name: str) -> date | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise exceptions.ValidationError({name: ["Give a date as YYYY-MM-DD."]}) from None


# --- auth ---------------------------------------------------------------------------------------------------


TOKEN_BODY = {
    "type": "object",
    "properties": {"token": {"type": "string"}, "expires_at": {"type": "string", "format": "date-time"}},
    "required": ["token", "expires_at"],
}


@extend_schema_view(
    post=extend_schema(
        summary="Get your API token",
        description="The token stays the same until it expires (`expires_at`, JOBSITE_API_TOKEN_TTL_SECONDS after "
                    "it was issued), your password changes or you revoke it; then this issues a new one. After "
                    "too many failed attempts for a username, its logins are refused for a while (429).",
        request=AuthTokenSerializer,
        responses={200: OpenApiResponse(TOKEN_BODY, description="Send it as `Authorization: Token <token>`."),
                   429: OpenApiResponse(ErrorSerializer,
                                        description="Too many failed login attempts; see Retry-After.")},
        auth=[],
    ),
    delete=extend_schema(
        summary="Revoke your API token",
        description="Deletes your token: requests with it then answer 401 (`jobctl logout`).",
        request=None,
        responses={204: None},
    ),
)
@extend_schema(tags=["auth"])
class TokenApi(ApiMixin, APIView):
    """``POST {username, password}`` → ``{"token", "expires_at"}`` (bad credentials: 400; locked: 429);
    ``DELETE`` revokes the caller's token → 204."""

    def get_permissions(self):
        if self.request.method == "POST":
            return [permissions.AllowAny()]
        return [permissions.IsAuthenticated()]

    def post(self, request: Request) -> Response:
        username = request.data.get("username") if isinstance(request.data, dict) else None
        if isinstance(username, str) and auth.login_locked(request, username):
            wait = auth.login_lock_seconds()
            raise exceptions.Throttled(wait=wait, detail=auth.TOO_MANY_ATTEMPTS.format(wait=wait))
        serializer = AuthTokenSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        token = auth.token_issue(user=serializer.validated_data["user"])
        return Response({"token": token.key, "expires_at": auth.token_expires_at(token)})

    def delete(self, request: Request) -> Response:
        auth.token_revoke(user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- jobs ---------------------------------------------------------------------------------------------------

LOG_HEADERS = [
    OpenApiParameter("X-Log-Size", OpenApiTypes.INT, OpenApiParameter.HEADER, response=[200],
                     description="Size in bytes of the whole log when it was read."),
    OpenApiParameter("X-Log-Start", OpenApiTypes.INT, OpenApiParameter.HEADER, response=[200],
                     description="Offset of the first byte sent."),
    OpenApiParameter("X-Log-End", OpenApiTypes.INT, OpenApiParameter.HEADER, response=[200],
                     description="Offset just past the last byte sent: the next `start` when following."),
    OpenApiParameter("X-Log-Attempt", OpenApiTypes.STR, OpenApiParameter.HEADER, response=[200],
                     description="The attempt whose log this is (empty: the job has no attempt yet)."),
    OpenApiParameter("X-Log-Replica", OpenApiTypes.INT, OpenApiParameter.HEADER, response=[200],
                     description="The replica (rank) whose log this is: the one asked for, or with `failed=true` "
                                 "the first that failed."),
    OpenApiParameter("X-Log-Failed-Rank", OpenApiTypes.STR, OpenApiParameter.HEADER, response=[200],
                     description="The first replica that failed in that attempt (empty: none has failed so far); "
                                 "the attempt's exit code is its."),
    OpenApiParameter("X-Job-Current-Attempt", OpenApiTypes.STR, OpenApiParameter.HEADER, response=[200],
                     description="The job's current attempt (empty: none yet)."),
    OpenApiParameter("X-Job-Phase", OpenApiTypes.STR, OpenApiParameter.HEADER, response=[200],
                     description="The job's phase when the log was read."),
    OpenApiParameter("X-Job-Finished", OpenApiTypes.STR, OpenApiParameter.HEADER, response=[200],
                     enum=["true", "false"],
                     description="`true` once the job has ended: a log read after that is complete."),
]
LOG_SEARCH_MAX = 200  # matches one search may return


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
class JobViewSet(ApiMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
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
            context["vocabulary"] = _vocabulary(self.request)
        return context

    def _detail(self, job: Job, *, status_code: int = status.HTTP_200_OK, **kw) -> Response:
        job = self.get_queryset().get(pk=job.pk)
        return Response(JobDetailSerializer(job, context=self.get_serializer_context()).data, status=status_code,
                        **kw)

    def _answer(self, write: Callable[[], Job], *, created: bool = False, headers: dict | None = None) -> Response:
        """``write``'s job, serialized in its transaction (``submit.answered``): a new job (``created``, 201) from
        the objects in hand, a changed one read again as the detail shows it. Nothing is read after the commit."""
        context = self.get_serializer_context()

        def serialize(job: Job) -> dict:
            job = submit.as_created(job) if created else self.get_queryset().get(pk=job.pk)
            return JobDetailSerializer(job, context=context).data

        job, data = submit.answered(write, serialize)
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
                    "body is a 422. Keys are per user.",
        request=JobSubmitSerializer,
        parameters=[submit.IDEMPOTENCY_KEY_PARAM],
        responses={201: JobDetailSerializer,
                   422: OpenApiResponse(ErrorSerializer,
                                        description="The Idempotency-Key was used with another request body.")},
    )
    def create(self, request: Request, *args, **kwargs) -> Response:
        self._vocabulary_checked()
        user, key = request.user, submit.idempotency_key(request)
        fingerprint = submit.fingerprint(request.data) if key else ""
        job = submit.submitted_with(user=user, key=key, fingerprint=fingerprint) if key else None
        if job is None:
            spec = submit.job_spec_checked(user=user, data=request.data)
            try:
                return self._answer(lambda: services.job_submit(user=user, spec=spec, idempotency_key=key,
                                                                fingerprint=fingerprint),
                                    created=True, headers={"Idempotent-Replayed": "false"} if key else None)
            except services.SubmitKeyTaken:
                # A concurrent submit with the same key committed first: answer its job.
                job = submit.submitted_with(user=user, key=key, fingerprint=fingerprint)
                if job is None:
                    raise Conflict("A submit with the same Idempotency-Key is in progress; try again.") from None
        location = reverse("api:job-detail", kwargs={"pk": job.pk}, request=request)  # a replay: its detail now
        return self._detail(job, status_code=status.HTTP_201_CREATED,
                            headers={"Location": location, "Idempotent-Replayed": "true"})

    def _vocabulary_checked(self) -> None:
        _vocabulary(self.request)  # a bad ?vocabulary= is a 400 before anything is written

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
        return self._answer(lambda: services.job_submit(user=request.user, spec=spec), created=True)

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

    @extend_schema(
        summary="Read a replica's log",
        description="text/plain. The whole log, its last `tail_bytes`, or bytes [`start`, `end`). The X-Log-* "
                    "headers give the slice and the log's size; follow a log by asking again with `start` set to "
                    "the last `X-Log-End` until `X-Job-Finished` is true and nothing new comes. With "
                    "`failed=true`, the log of the attempt's first failed replica (404 when none failed).",
        parameters=[
            OpenApiParameter("replica", COUNT, description="Replica rank (default 0)."),
            OpenApiParameter("failed", OpenApiTypes.BOOL,
                             description="`true`: the log of the first replica that failed in the attempt (the one "
                                         "whose exit code the attempt has), as `mcli logs --failed`. 404 when no "
                                         "replica of the attempt failed; 400 with a `replica` that is another "
                                         "rank."),
            OpenApiParameter("attempt", COUNT, description="Attempt number (default: the current one)."),
            OpenApiParameter("tail_bytes", COUNT, description="Only the last N bytes."),
            OpenApiParameter("start", COUNT, description="First byte offset (default 0)."),
            OpenApiParameter("end", COUNT, description="Offset to stop before (default: the size)."),
            *LOG_HEADERS,
        ],
        responses={(200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="The log bytes.")},
        filters=False,
    )
    @action(detail=True, methods=["get"], renderer_classes=[renderers.JSONRenderer, PlainTextRenderer],
            filter_backends=[], pagination_class=None)
    def logs(self, request: Request, pk: str | None = None) -> HttpResponse:
        job = self.get_object()  # read before the file: a log read once the job has ended is complete
        start = _int_param(request, "start", default=None)
        end = _int_param(request, "end", default=None)
        tail_bytes = _int_param(request, "tail_bytes", default=None)
        if tail_bytes is not None and start is not None:
            raise exceptions.ValidationError({"tail_bytes": ["Give either tail_bytes or start, not both."]})
        if start is not None and end is not None and end < start:
            raise exceptions.ValidationError({"end": ["end must be at least start."]})
        target = _log_target(request, job)
        # The file may grow while it is sent: send what it held when opened.
        content = logs.open_slice(target.path, start=start, end=end, tail_bytes=tail_bytes)
        return _log_response(request, target, content)

    @extend_schema(
        summary="Search a replica's whole log",
        description="The lines of the log that contain `q` (case-insensitive for ASCII letters), with their byte "
                    "offsets: the first `limit` at or after byte `after`, or with `before` the last `limit` whose "
                    "match starts before it (previous). Next: ask again with `after` one past the last match's "
                    "`offset`. The log is read in chunks, so any size can be searched.",
        parameters=[
            OpenApiParameter("q", OpenApiTypes.STR, required=True, description="Text to find (1 to 200 characters)."),
            OpenApiParameter("replica", COUNT, description="Replica rank (default 0)."),
            OpenApiParameter("failed", OpenApiTypes.BOOL, description="As for the log: the first failed replica."),
            OpenApiParameter("attempt", COUNT, description="Attempt number (default: the current one)."),
            OpenApiParameter("after", COUNT, description="Byte offset to search from (default 0)."),
            OpenApiParameter("before", COUNT, description="Search backwards: matches starting before this offset."),
            OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": LOG_SEARCH_MAX},
                             description=f"Most matches to return (default 20, at most {LOG_SEARCH_MAX})."),
        ],
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="`{matches: [{offset, line_start, "
                                        "line_end, text, text_start}], size, attempt, replica}`.")},
        filters=False,
    )
    @action(detail=True, methods=["get"], url_path="logs/search", filter_backends=[], pagination_class=None)
    def log_search(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        query = request.query_params.get("q", "")
        if not query or len(query) > 200 or "\n" in query:
            raise exceptions.ValidationError({"q": ["Give 1 to 200 characters on one line."]})
        after = _int_param(request, "after", default=None)
        before = _int_param(request, "before", default=None)
        if after is not None and before is not None:
            raise exceptions.ValidationError({"before": ["Give either after or before, not both."]})
        limit = _int_param(request, "limit", default=20)
        if not 1 <= limit <= LOG_SEARCH_MAX:
            raise exceptions.ValidationError({"limit": [f"Give a number from 1 to {LOG_SEARCH_MAX}."]})
        target = _log_target(request, job)
        found = logs.search_log(target.path, query, after=after or 0, before=before, limit=limit) \
            if target.path else None
        size = target.path.stat().st_size if found is not None else 0
        return Response({"matches": [m.as_dict() for m in found or []], "size": size,
                         "attempt": target.attempt.number if target.attempt else None, "replica": target.replica},
                        headers={"Cache-Control": "no-store"})

    @extend_schema(
        summary="A replica's whole log, to open in a browser tab or save",
        description="text/plain, shown in the browser (`download=true`: saved as a file). Same choice of attempt "
                    "and replica, same headers, as the log.",
        parameters=[
            OpenApiParameter("replica", COUNT, description="Replica rank (default 0)."),
            OpenApiParameter("failed", OpenApiTypes.BOOL, description="As for the log: the first failed replica."),
            OpenApiParameter("attempt", COUNT, description="Attempt number (default: the current one)."),
            OpenApiParameter("download", OpenApiTypes.BOOL, description="`true`: as an attachment."),
            *LOG_HEADERS,
        ],
        responses={(200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="The log bytes.")},
        filters=False,
    )
    @action(detail=True, methods=["get"], url_path="logs/raw", renderer_classes=[renderers.JSONRenderer,
            PlainTextRenderer], filter_backends=[], pagination_class=None)
    def log_raw(self, request: Request, pk: str | None = None) -> HttpResponse:
        job = self.get_object()
        download = _bool_param(request, "download")
        target = _log_target(request, job)
        response = _log_response(request, target, logs.open_slice(target.path))
        name = f"job-{job.pk}-attempt-{target.attempt.number if target.attempt else 0}-replica-{target.replica}.log"
        response["Content-Disposition"] = f'{"attachment" if download else "inline"}; filename="{name}"'
        response["X-Content-Type-Options"] = "nosniff"
        return response


@dataclass(frozen=True)
class _LogTarget:
    job: Job
    attempt: Attempt | None  # None: not admitted yet, so no log so far
    replica: int
    path: Path | None


def _log_target(request: Request, job: Job) -> _LogTarget:
    """The replica log that ``?attempt=``, ``?replica=`` and ``?failed=`` choose (400/404 as the log action)."""
    replica = _int_param(request, "replica", default=None)
    failed = _bool_param(request, "failed")
    attempt_number = _int_param(request, "attempt", default=None)
    if attempt_number is None:
        attempt = job.current_attempt
    else:
        attempt = job.attempts.filter(number=attempt_number).first() if attempt_number < 2**31 else None
        if attempt is None:
            raise exceptions.NotFound(f"Job #{job.pk} has no attempt {attempt_number}.")
    try:
        replica = selectors.attempt_log_rank(attempt, replica=replica, failed=failed)
    except selectors.NoFailedReplica as exc:
        raise exceptions.NotFound(str(exc)) from None
    except selectors.ReplicaNotFailed as exc:
        raise exceptions.ValidationError({"replica": [str(exc)]}) from None
    replicas = attempt.replicas if attempt else job.replicas
    if not 0 <= replica < replicas:
        raise exceptions.NotFound(f"Replica {replica} does not exist: the job has replicas 0 to {replicas - 1}.")
    path = None
    if attempt is not None:
        path = logs.log_path(attempt, replica)
        if path is None:
            raise exceptions.NotFound(f"The logs of backend '{attempt.backend}' are not available here.")
    return _LogTarget(job, attempt, replica, path)


def _log_response(request: Request, target: _LogTarget, content: logs.FileSlice | None) -> HttpResponse:
    """``content`` (None: no log yet) as text/plain with the X-Log-* and X-Job-* headers."""
    job, attempt = target.job, target.attempt
    headers = {
        "X-Log-Attempt": str(attempt.number) if attempt else "",
        "X-Log-Replica": str(target.replica),
        "X-Log-Failed-Rank": str(attempt.failed_rank) if attempt and attempt.failed_rank is not None else "",
        "X-Job-Current-Attempt": str(job.current_attempt.number) if job.current_attempt_id else "",
        "X-Job-Phase": job.phase,
        "X-Job-Finished": "true" if job.phase in TERMINAL_PHASES else "false",
        "Cache-Control": "no-store",
    }
    if content is None:
        response = HttpResponse(b"", content_type=TEXT_PLAIN)
        headers.update({"X-Log-Size": "0", "X-Log-Start": "0", "X-Log-End": "0"})
    else:
        response = StreamingHttpResponse(content.body_for(request), content_type=TEXT_PLAIN)
        headers.update({"X-Log-Size": str(content.size), "X-Log-Start": str(content.start),
                        "X-Log-End": str(content.start + content.remaining)})
    for name, value in headers.items():
        response[name] = value
    return response


# --- groups -------------------------------------------------------------------------------------------------


@extend_schema_view(
    list=extend_schema(summary="Your groups, with quotas and current usage"),
    retrieve=extend_schema(summary="A group: quotas, usage, and what each user holds", parameters=[GROUP_NAME_PARAM]),
)
@extend_schema(tags=["groups"])
class GroupViewSet(ApiMixin, viewsets.GenericViewSet):
    """Groups you belong to (all for superusers); others do not exist for you (404)."""

    permission_classes = [permissions.IsAuthenticated]
    pagination_class = JobPagination
    filter_backends: list = []
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    serializer_class = GroupSerializer
    queryset = Group.objects.none()

    def get_queryset(self):
        return selectors.groups_of(self.request.user).order_by("name")

    def get_object(self) -> Group:
        group = queries.visible_group(self.request.user, self.kwargs["name"])
        if group is None:
            raise exceptions.NotFound(f"No group '{self.kwargs['name'][:63]}' of yours.")
        return group

    def _rows(self, groups: list[Group]) -> list[dict]:
        overview = queries.groups_overview(self.request.user, groups)
        return [{"name": g.name, "display_name": g.display_name, "description": g.description,
                 "queue_stopped": g.queue_stopped, **overview[g.pk]} for g in groups]

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(GroupSerializer(self._rows(list(page)), many=True).data)

    @extend_schema(responses={200: GroupDetailSerializer})
    def retrieve(self, request: Request, name: str | None = None) -> Response:
        group = self.get_object()
        [row] = self._rows([group])
        row["users"] = selectors.group_user_usage(group)
        return Response(GroupDetailSerializer(row).data)

    @extend_schema(summary="A group's queue in order, with each job's reason and position",
                   parameters=[GROUP_NAME_PARAM], responses={200: QueueEntrySerializer(many=True)})
    @action(detail=True, methods=["get"])
    def queue(self, request: Request, name: str | None = None) -> Response:
        group = self.get_object()
        page = self.paginate_queryset(selectors.group_queue(group))
        first = self.paginator.page.start_index() if page else 1
        rows = [
            {"rank": first + i, "queue_position": j.queue_position, "id": j.pk, "name": j.name,
             "user": j.user.get_username(), "instance_type": j.instance_type.name, "replicas": j.replicas,
             "request": {str(r): amount for r, amount in j.total_request.items()},
             "priority": j.priority, "preemptible": j.preemptible, "phase": j.phase, "status": j.status,
             "color": j.color, "reason": j.reason, "message": j.message, "queued_at": j.queued_at,
             "estimated_start": j.estimated_start, "estimate_basis": j.estimate_basis}
            for i, j in enumerate(page)
        ]
        return self.get_paginated_response(QueueEntrySerializer(rows, many=True).data)

    @extend_schema(summary="Instance types allowed in a group", parameters=[GROUP_NAME_PARAM],
                   responses={200: InstanceTypeSerializer(many=True)})
    @action(detail=True, methods=["get"], url_path="instance-types", url_name="instance-types")
    def instance_types(self, request: Request, name: str | None = None) -> Response:
        group = self.get_object()
        page = self.paginate_queryset(selectors.instance_types_for(group).order_by("gpu", "name"))
        return self.get_paginated_response(InstanceTypeSerializer(page, many=True).data)

    @extend_schema(summary="Images allowed in a group", parameters=[GROUP_NAME_PARAM],
                   responses={200: ImageSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def images(self, request: Request, name: str | None = None) -> Response:
        group = self.get_object()
        page = self.paginate_queryset(selectors.images_for(group).order_by("name"))
        return self.get_paginated_response(ImageSerializer(page, many=True).data)


# --- cluster ------------------------------------------------------------------------------------------------


class UtilisationApi(ApiMixin, APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(tags=["cluster"], summary="Cluster utilisation: GPUs per node, per group, and per user",
                   description="Every group with running or queued jobs in aggregate (`groups`); `users` covers "
                               "only the groups you are a member of (every group for staff).",
                   responses={200: UtilisationSerializer})
    def get(self, request: Request) -> Response:
        util = selectors.cluster_utilisation(request.user)
        util["nodes"] = [{"name": n.name, "gpu_total": n.gpu_total, "gpu_used": n.gpu_used, "gpu_free": n.gpu_free}
                         for n in util["nodes"]]
        return Response(UtilisationSerializer(util).data)


class UsageApi(ApiMixin, APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(
        tags=["cluster"],
        summary="GPU-hours per day, group and user",
        description=f"Over the groups you may see. Defaults: the last {USAGE_DEFAULT_DAYS} days up to today; at "
                    f"most {USAGE_MAX_DAYS} days at once. An attempt counts GPUs × time from entering PREPARING "
                    "to leaving TERMINATING, on the day it started.",
        parameters=[
            OpenApiParameter("since", OpenApiTypes.DATE, description="First day (YYYY-MM-DD)."),
            OpenApiParameter("until", OpenApiTypes.DATE, description="Last day, included (default today)."),
            OpenApiParameter("group", OpenApiTypes.STR, description="Only this group."),
            OpenApiParameter("user", OpenApiTypes.STR, description="Only this user's jobs."),
        ],
        responses={200: UsageSerializer},
    )
    def get(self, request: Request) -> Response:
        until = _date_param(request, "until") or timezone.localdate()
        since = _date_param(request, "since")
        if since is None:
            try:
                since = until - timedelta(days=USAGE_DEFAULT_DAYS - 1)
            except OverflowError:
                since = date.min
        if since > until:
            raise exceptions.ValidationError({"since": ["since must be on or before until."]})
        if (until - since).days >= USAGE_MAX_DAYS:
            raise exceptions.ValidationError({"since": [f"Ask for at most {USAGE_MAX_DAYS} days at once."]})
        group = request.query_params.get("group") or None
        user = request.query_params.get("user") or None
        for name, value in (("group", group), ("user", user)):
            if value is not None and ("\x00" in value or len(value) > 150):
                raise exceptions.ValidationError({name: ["Not a valid name."]})
        rows = selectors.gpu_usage(request.user, since=since, until=until, group=group, username=user)
        body = {"since": since, "until": until, "group": group, "user": user,
                "total_gpu_hours": round(sum(r["gpu_hours"] for r in rows), 3), "rows": rows}
        return Response(UsageSerializer(body).data)


class VocabulariesApi(ApiMixin, APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(tags=["jobs"], summary="The status vocabularies: ours to Run:ai, Kueue/jobq, mcli, ModelArts, "
                                          "PrimeHub and back", responses={200: VocabulariesSerializer})
    def get(self, request: Request) -> Response:
        rows = [
            {"phase": r.phase.value, "status": r.status, "runai": r.runai, "kueue": r.kueue, "mcli": r.mcli,
             "modelarts": r.modelarts, "modelarts_name": vocabularies.MODELARTS_CODES[r.modelarts],
             "primehub": r.primehub, "note": r.note}
            for r in vocabularies.ROWS
        ]
        reverse_table = {
            name: {str(k): phase.value for k, phase in table.items()} for name, table in vocabularies.REVERSE.items()
        }
        return Response(VocabulariesSerializer({
            "vocabularies": vocabularies.VOCABULARIES, "aliases": vocabularies.ALIASES, "rows": rows,
            "reverse": reverse_table,
        }).data)


@extend_schema(exclude=True)
class NotFoundApi(ApiMixin, APIView):
    """Any other path under /api/v1/ ending in a slash: a 404 in the API's error shape, not an HTML page."""

    permission_classes = [permissions.AllowAny]
    authentication_classes: list = []

    def get(self, request: Request, *args, **kwargs):
        raise exceptions.NotFound(f"No API endpoint at {request.path}.")

    post = put = patch = delete = get
