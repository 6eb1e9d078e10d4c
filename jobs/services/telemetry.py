"""GPU telemetry of attempts: bounded series (pure downsampling) and their write, and the idle-GPU rule.

Per attempt and GPU three series: 10 s points for the last hour, 1 min points for the last day, 10 min points for
the job's life (a few KB per GPU-day). A point is [epoch, SM %, memory used B, memory total B, power W, temp C]."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from ..choices import EventType, NotifyEvent, Phase
from ..models import Attempt, GpuSeries, Job
from .events import event_record
from .notifications import notifications_enqueue
from .transitions import job_terminate

TIERS: tuple[tuple[int, int | None], ...] = ((10, 3600), (60, 86400), (600, None))  # (seconds/point, kept for)
IDLE_REASON = "GpusIdle"
IDLE_STOP_REASON = "GpusIdleStopped"


def downsample(points: Iterable[list], resolution: int) -> list[list]:
    """Pure: one point per ``resolution`` bucket (its start), the mean of each figure, memory total its max."""
    buckets: dict[int, list[list]] = {}
    for p in points:
        buckets.setdefault(int(p[0]) // resolution * resolution, []).append(p)
    out = []
    for start in sorted(buckets):
        group = buckets[start]
        n = len(group)
        out.append([start, round(sum(p[1] for p in group) / n, 1), int(sum(p[2] for p in group) / n),
                    max(p[3] for p in group), round(sum(p[4] for p in group) / n, 1),
                    round(sum(p[5] for p in group) / n, 1)])
    return out


def tiers_add(tiers: dict[int, list], points: list[list], now: float) -> dict[int, list]:
    """Pure: ``tiers`` ({resolution: points}) with ``points`` added at the finest; what falls out of a tier's window
    goes, downsampled, into the next coarser one."""
    tiers = {res: list(tiers.get(res, [])) for res, _ in TIERS}
    finest = TIERS[0][0]
    tiers[finest] = sorted(tiers[finest] + points, key=lambda p: p[0])
    for (res, keep), (coarser, _) in zip(TIERS, TIERS[1:], strict=False):
        cutoff = now - keep
        old = [p for p in tiers[res] if p[0] < cutoff]
        if old:
            tiers[res] = [p for p in tiers[res] if p[0] >= cutoff]
            first = min(p[0] for p in old) // coarser * coarser  # only the buckets these points fall in change
            kept = [p for p in tiers[coarser] if p[0] < first]
            tiers[coarser] = kept + downsample([p for p in tiers[coarser] if p[0] >= first] + old, coarser)
    return tiers


@transaction.atomic
def gpu_points_record(*, attempt: Attempt, readings: list[tuple[int, str, str, list]], interval: float) -> None:
    """Store one round's readings of an attempt ([(rank, node, gpu, point)]) and update its running means."""
    if not readings:
        return
    attempt = Attempt.objects.select_for_update().get(pk=attempt.pk)
    series: dict[tuple[int, str], dict[int, GpuSeries]] = {}
    for s in GpuSeries.objects.filter(attempt=attempt):  # one read for all its GPUs
        series.setdefault((s.rank, s.gpu), {})[s.resolution] = s
    for rank, node, gpu, point in readings:
        rows = series.get((rank, gpu), {})
        tiers = tiers_add({res: s.points for res, s in rows.items()}, [point], now=point[0])
        for res, pts in tiers.items():
            if res in rows:
                if rows[res].points != pts:
                    rows[res].points = pts
                    rows[res].save(update_fields=["points", "updated_at"])
            elif pts:
                GpuSeries.objects.create(attempt=attempt, rank=rank, node=node, gpu=gpu, resolution=res, points=pts)
    total = (attempt.gpu_util_mean or 0.0) * attempt.gpu_samples + sum(p[1] for *_, p in readings)
    attempt.gpu_samples += len(readings)
    attempt.gpu_util_mean = round(total / attempt.gpu_samples, 2)
    attempt.gpu_util_seconds += sum(p[1] for *_, p in readings) / 100.0 * interval
    attempt.save(update_fields=["gpu_samples", "gpu_util_mean", "gpu_util_seconds"])


# --- idle GPUs ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdleStep:
    idle_since: datetime | None
    warn: bool = False
    stop: bool = False


def idle_step(*, busiest: float | None, idle_since: datetime | None, now: datetime, threshold: float,
              minutes: float, warned: bool, interactive: bool = False, stop_minutes: float | None = None) -> IdleStep:
    """Pure: the idle state after a round whose busiest GPU of the job read ``busiest`` SM % (None: no reading, so
    nothing changes). All GPUs under ``threshold`` for ``minutes``: warn once per spell; an interactive job idle a
    further ``stop_minutes`` (when set) is stopped."""
    if busiest is None:
        return IdleStep(idle_since)
    if busiest >= threshold:
        return IdleStep(None)
    since = idle_since or now
    idle_for = now - since
    long_enough = idle_for >= timedelta(minutes=minutes)
    stop = bool(interactive and stop_minutes and idle_for >= timedelta(minutes=minutes + stop_minutes))
    return IdleStep(since, warn=long_enough and not warned, stop=stop)


def idle_words(minutes: float) -> str:
    return f"GPUs idle for {minutes:g} min"


@transaction.atomic
def job_idle_update(*, job: Job, busiest: float | None, now: datetime) -> IdleStep:
    """Apply ``idle_step`` to a running job: Job.gpus_idle_since, one Warning event per idle spell and an
    ``idle_gpus`` notification for the subscribers who asked for it."""
    minutes = settings.JOBSITE_GPU_IDLE_MINUTES
    since = job.gpus_idle_since
    warned = since is not None and job.events.filter(reason=IDLE_REASON, time__gte=since).exists()
    step = idle_step(busiest=busiest, idle_since=since, now=now, threshold=settings.JOBSITE_GPU_IDLE_UTIL,
                     minutes=minutes, warned=warned, interactive=job.job_type == "interactive",
                     stop_minutes=settings.JOBSITE_GPU_IDLE_STOP_INTERACTIVE_MINUTES)
    if step.idle_since != since:
        Job.objects.filter(pk=job.pk).update(gpus_idle_since=step.idle_since)
        job.gpus_idle_since = step.idle_since
    if step.warn:
        event = event_record(job=job, reason=IDLE_REASON, type=EventType.WARNING,
                             message=f"{idle_words(minutes)} (every GPU under {settings.JOBSITE_GPU_IDLE_UTIL:g} %)",
                             at=max(step.idle_since + timedelta(minutes=minutes), job.created_at))
        notifications_enqueue(job=job, event=event, kinds=frozenset({NotifyEvent.IDLE_GPUS}), at=now)
    if step.stop and job.phase == Phase.RUNNING:
        grace = settings.JOBSITE_GPU_IDLE_STOP_INTERACTIVE_MINUTES
        job_terminate(job=Job.objects.select_for_update().get(pk=job.pk), target=Phase.CANCELLED,
                      reason=IDLE_STOP_REASON, message=f"Stopped: {idle_words(minutes + grace)} (an interactive job "
                      f"is stopped {grace:g} min after its idle warning)")
    return step
