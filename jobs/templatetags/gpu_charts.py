"""The job detail page's GPU card: per GPU a server-rendered SVG of SM % and memory % over the current attempt."""

from __future__ import annotations

from datetime import timedelta

from django import template
from django.conf import settings
from django.utils import timezone

from ..telemetry_selectors import GpuTimeline, gpu_timelines

register = template.Library()
WIDTH, HEIGHT = 600, 120


def polyline(points: list[list], value, start: float, span: float) -> str:
    """Pure: SVG polyline coordinates of ``value(point)`` (0–100) over time, left to right."""
    coords = []
    for p in points:
        x = (p[0] - start) / span * WIDTH if span else WIDTH
        y = HEIGHT - max(0.0, min(100.0, value(p))) / 100 * HEIGHT
        coords.append(f"{x:.1f},{y:.1f}")
    return " ".join(coords)


def mem_pct(p: list) -> float:
    return p[2] / p[3] * 100 if p[3] else 0.0


def chart(timeline: GpuTimeline) -> dict:
    pts = timeline.points
    start, end = pts[0][0], pts[-1][0]
    span = end - start
    last = timeline.latest
    return {
        "rank": timeline.rank, "node": timeline.node, "gpu": timeline.gpu, "width": WIDTH, "height": HEIGHT,
        "sm": polyline(pts, lambda p: p[1], start, span), "mem": polyline(pts, mem_pct, start, span),
        "sm_now": last[1], "mem_used_gib": last[2] / 2**30, "mem_total_gib": last[3] / 2**30,
        "mem_now": mem_pct(last), "power": last[4], "temp": last[5], "minutes": span / 60,
        "mean": sum(p[1] for p in pts) / len(pts),
    }


@register.simple_tag
def gpu_panel(job) -> dict:
    """What the GPU card shows: nothing for a job without GPUs, charts when there is telemetry, else why not."""
    attempt = job.current_attempt
    if not job.gpu or attempt is None:
        return {"show": False}
    charts = [chart(t) for t in gpu_timelines(attempt) if t.points]
    return {"show": True, "charts": charts, "attempt": attempt, "virtual": attempt.backend in ("local", "sim")}


@register.filter
def gpus_idle(job) -> bool:
    """Whether the job's GPUs have been idle for JOBSITE_GPU_IDLE_MINUTES (a short pause is no idle badge)."""
    since = job.gpus_idle_since
    return since is not None and timezone.now() - since >= timedelta(minutes=settings.JOBSITE_GPU_IDLE_MINUTES)
