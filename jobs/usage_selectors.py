"""The usage page's GPU telemetry figures beside its GPU-hours: utilised GPU-hours and idle GPU-hours per
(day, group, user), and their sums per group, per user and per day.

Utilised GPU-hours: the sum of the attempts' ``gpu_util_seconds`` (each telemetry reading's SM % × its interval)
/ 3600. Idle GPU-hours: the time covered by the stored points (10 s, 1 min, 10 min) of each GPU whose SM % is under
JOBSITE_GPU_IDLE_UTIL. Both only from attempts with telemetry samples; a row without any shows no figure (None),
never an invented 0."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from .models import Attempt, GpuSeries, Membership
from .telemetry_selectors import idle_seconds

Key = tuple[date, str, str]  # (day, group, user)


@dataclass
class Figures:
    hours: float = 0.0
    util_seconds: float = 0.0
    idle_seconds: float = 0.0
    samples: int = 0

    @property
    def utilised(self) -> float | None:
        """Utilised GPU-hours; None without telemetry."""
        return self.util_seconds / 3600 if self.samples else None

    @property
    def idle(self) -> float | None:
        """Idle GPU-hours; None without telemetry."""
        return self.idle_seconds / 3600 if self.samples else None

    def add(self, other: Figures) -> None:
        self.hours += other.hours
        self.util_seconds += other.util_seconds
        self.idle_seconds += other.idle_seconds
        self.samples += other.samples


def rollup(rows: Iterable[dict], telemetry: dict[Key, Figures], key: Callable[[Key], object]) -> dict:
    """Pure: ``rows`` (``selectors.gpu_usage``: day, group, user, gpu_hours) and ``telemetry`` per (day, group,
    user) summed per ``key(day, group, user)``."""
    out: dict = {}
    for r in rows:
        out.setdefault(key((r["day"], r["group"], r["user"])), Figures()).hours += r["gpu_hours"]
    for k, figures in telemetry.items():
        out.setdefault(key(k), Figures()).add(Figures(0.0, figures.util_seconds, figures.idle_seconds,
                                                      figures.samples))
    return out


def usage_telemetry(user: AbstractBaseUser, *, since: date, until: date, group: str | None = None,
                    threshold: float) -> dict[Key, Figures]:
    """Utilised and idle GPU-seconds per (day the attempt started, group, user) of the attempts ``gpu_usage``
    counts (same window and visibility) that have telemetry samples."""
    attempts = Attempt.objects.filter(started_at__date__gte=since, started_at__date__lte=until, gpu__gt=0,
                                      gpu_samples__gt=0)
    if not user.is_superuser:
        attempts = attempts.filter(job__group__in=Membership.objects.filter(user=user).values("group_id"))
    if group:
        attempts = attempts.filter(job__group__name=group)
    keys: dict[int, Key] = {}
    out: dict[Key, Figures] = {}
    for a in attempts.values("pk", "started_at", "gpu_util_seconds", "gpu_samples", "job__group__name",
                             "job__user__username"):
        key = (timezone.localdate(a["started_at"]), a["job__group__name"], a["job__user__username"])
        keys[a["pk"]] = key
        figures = out.setdefault(key, Figures())
        figures.util_seconds += a["gpu_util_seconds"]
        figures.samples += a["gpu_samples"]
    tiers: dict[tuple[int, int, str], dict[int, list]] = {}
    for attempt_id, rank, gpu, resolution, points in GpuSeries.objects.filter(attempt__in=attempts).order_by(
            "start").values_list("attempt_id", "rank", "gpu", "resolution", "points"):
        tiers.setdefault((attempt_id, rank, gpu), {}).setdefault(resolution, []).extend(points)
    for (attempt_id, _, _), by_resolution in tiers.items():
        out[keys[attempt_id]].idle_seconds += idle_seconds(by_resolution, threshold)
    return out
