"""The admin's GPU usage page: GPU-hours per group, per user and per day over the last N days, read-only."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib import admin
from django.template.response import TemplateResponse
from django.utils import timezone

from jobs import selectors, usage_selectors
from jobs.models import GpuUsage


@admin.register(GpuUsage)
class GpuUsageAdmin(admin.ModelAdmin):
    """GPU-hours per group, per user and per day over the last N days (``?days=``), read-only."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_staff

    def changelist_view(self, request, extra_context=None):
        try:
            days = min(max(int(request.GET.get("days", 30)), 1), 366)
        except ValueError:
            days = 30
        until = timezone.localdate()
        since = until - timedelta(days=days - 1)
        rows = selectors.gpu_usage(request.user, since=since, until=until,
                                   group=request.GET.get("group") or None)
        by_group: dict[str, float] = {}
        by_user: dict[tuple[str, str], float] = {}
        by_day: dict = {}
        for r in rows:
            by_group[r["group"]] = by_group.get(r["group"], 0) + r["gpu_hours"]
            by_user[(r["group"], r["user"])] = by_user.get((r["group"], r["user"]), 0) + r["gpu_hours"]
            by_day[r["day"]] = by_day.get(r["day"], 0) + r["gpu_hours"]
        tele = usage_selectors.usage_telemetry(request.user, since=since, until=until,
                                               group=request.GET.get("group") or None,
                                               threshold=settings.JOBSITE_GPU_IDLE_UTIL)
        per_group = usage_selectors.rollup(rows, tele, lambda k: k[1])
        per_user = usage_selectors.rollup(rows, tele, lambda k: k[1:])
        per_day = usage_selectors.rollup(rows, tele, lambda k: k[0])
        context = {
            **self.admin_site.each_context(request),
            "title": f"GPU usage, last {days} days",
            "opts": self.model._meta,
            "days": days,
            "since": since,
            "until": until,
            "by_group": sorted(((g, h, per_group[g]) for g, h in by_group.items()), key=lambda t: -t[1]),
            "by_user": sorted(((g, u, h, per_user[(g, u)]) for (g, u), h in by_user.items()), key=lambda t: -t[2]),
            "by_day": sorted((d, h, per_day[d]) for d, h in by_day.items()),
            "total": sum(by_group.values()), "idle_util": settings.JOBSITE_GPU_IDLE_UTIL,
        }
        return TemplateResponse(request, "admin/jobs/gpu_usage.html", context)
