"""The cluster resource: utilisation now (GPUs per node, group and user) and GPU-hours used per day."""

from __future__ import annotations

from datetime import date, timedelta

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, permissions
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import selectors

from ..serializers.cluster import UsageSerializer, UtilisationSerializer
from .base import ApiMixin
from .query_params import date_param

USAGE_MAX_DAYS = 366
USAGE_DEFAULT_DAYS = 30


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
        until = date_param(request, "until") or timezone.localdate()
        since = date_param(request, "since")
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
