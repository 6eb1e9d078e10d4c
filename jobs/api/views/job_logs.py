"""The jobs resource's logs: read a replica's log (a slice, a tail, or to follow), search it, or get it whole as a
file; with the X-Log-* and X-Job-* headers that say which log it is and how far it goes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, renderers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from jobs import logs, selectors
from jobs.choices import TERMINAL_PHASES
from jobs.models import Attempt, Job

from ..exceptions import error_body
from .query_params import COUNT, bool_param, int_param

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
            body = data if "errors" in data else error_body(data)
            lines = [f"{path}: {message}" for path, messages in body["errors"].items() for message in messages]
            lines = lines or [str(body["detail"])]
            return ("\n".join(lines) + "\n").encode()
        return str(data).encode()


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


class JobLogsMixin:
    """The log actions of ``JobViewSet``: ``GET /jobs/{id}/logs/``, ``/logs/search/`` and ``/logs/raw/``."""

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
        start = int_param(request, "start", default=None)
        end = int_param(request, "end", default=None)
        tail_bytes = int_param(request, "tail_bytes", default=None)
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
        after = int_param(request, "after", default=None)
        before = int_param(request, "before", default=None)
        if after is not None and before is not None:
            raise exceptions.ValidationError({"before": ["Give either after or before, not both."]})
        limit = int_param(request, "limit", default=20)
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
        download = bool_param(request, "download")
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
    replica = int_param(request, "replica", default=None)
    failed = bool_param(request, "failed")
    attempt_number = int_param(request, "attempt", default=None)
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
