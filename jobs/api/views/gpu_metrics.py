"""A job's GPU telemetry: per GPU of an attempt, its SM utilisation, memory, power and temperature over time."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, permissions
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import selectors
from jobs.telemetry_selectors import gpu_timelines

from ..serializers.gpu_metrics import GpuMetricsSerializer
from .base import ApiMixin
from .query_params import int_param


class GpuMetricsApi(ApiMixin, APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(tags=["jobs"], summary="A job's GPU telemetry, per GPU",
                   parameters=[OpenApiParameter("attempt", OpenApiTypes.INT, description="Attempt number")],
                   responses={200: GpuMetricsSerializer})
    def get(self, request: Request, pk: int) -> Response:
        job = selectors.jobs_visible_to(request.user).filter(pk=pk).first()
        if job is None:
            raise exceptions.NotFound(f"No job {pk} in your groups.")
        number = int_param(request, "attempt", default=None)
        attempt = (job.attempts.filter(number=number).first() if number is not None else job.current_attempt)
        if number is not None and attempt is None:
            raise exceptions.NotFound(f"Job {pk} has no attempt {number}.")
        timelines = gpu_timelines(attempt)
        return Response(GpuMetricsSerializer({
            "job": job.pk, "attempt": attempt.number if attempt else None,
            "gpu_util_mean": attempt.gpu_util_mean if attempt else None,
            "gpu_samples": attempt.gpu_samples if attempt else 0, "gpus_idle_since": job.gpus_idle_since,
            "telemetry": any(t.points for t in timelines),
            "gpus": [{"rank": t.rank, "node": t.node, "gpu": t.gpu, "points": t.points} for t in timelines],
        }).data)
