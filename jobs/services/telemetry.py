"""GPU telemetry of attempts: bounded series (pure downsampling) and their write, and the idle-GPU rule.

Per attempt and GPU three levels: 10 s points for the last hour, 1 min points for the last day, 10 min points for
the job's life (a few KB per GPU-day), each kept as rows of a fixed stretch of time (``LEVELS``). A point is
[epoch, SM %, memory used B, memory total B, power W, temp C]."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ..choices import EventType, NotifyEvent, Phase
from ..models import Attempt, GpuSeries, Job
from .events import event_record
from .notifications import notifications_enqueue
from .transitions import job_terminate

# Per attempt and GPU, rows of points that each span a fixed stretch of time: (seconds a point, seconds a row spans,
# kept for; None: the job's life). A round appends its point to the newest 10 s row (at most 6 points: a small
# write); a row whose window has passed is downsampled into a point of the next level's row and deleted. So a round
# writes a few hundred bytes, a minute adds a 1 min point to a 10 min row and every 10 min a 10 min point goes into
# a 6 h row: a GPU-day ends up as 4 rows of 36 points.
LEVELS: tuple[tuple[int, int, int | None], ...] = ((10, 60, 3600), (60, 600, 86400), (600, 21600, None))
RESOLUTIONS = tuple(level[0] for level in LEVELS)
Rows = dict[tuple[int, int], list[list]]  # (resolution, row start epoch) → points, oldest first
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


def row_start(epoch: float, level: int) -> int:
    """Pure: the start of the row of ``level`` that a point at ``epoch`` falls in."""
    span = LEVELS[level][1]
    return int(epoch) // span * span


def row_expired(start: int, level: int, now: float) -> bool:
    """Pure: whether a row of ``level`` starting at ``start`` lies wholly before its level's window."""
    _, span, keep = LEVELS[level]
    return keep is not None and start + span <= now - keep


def series_add(rows: Rows, points: list[list], now: float) -> tuple[Rows, set[tuple[int, int]]]:
    """Pure: one GPU's ``rows`` (those this round may touch: the newest 10 s row, the expired rows and the rows they
    fold into) after ``points`` are added at ``now``: (the rows to write, the rows to delete). Each row past its
    level's window is downsampled into the next level's rows and goes."""
    given = set(rows)
    rows = {key: list(pts) for key, pts in rows.items()}
    written: set[tuple[int, int]] = set()
    for p in points:
        key = (RESOLUTIONS[0], row_start(p[0], 0))
        rows[key] = sorted([*rows.get(key, []), p], key=lambda q: q[0])
        written.add(key)
    deleted: set[tuple[int, int]] = set()
    for level, resolution in enumerate(RESOLUTIONS[:-1]):
        coarser = RESOLUTIONS[level + 1]
        for key in sorted(k for k in rows if k[0] == resolution and row_expired(k[1], level, now)):
            for q in downsample(rows.pop(key), coarser):
                target = (coarser, row_start(q[0], level + 1))
                rows[target] = sorted([p for p in rows.get(target, []) if p[0] != q[0]] + [q], key=lambda p: p[0])
                written.add(target)
            written.discard(key)
            if key in given:
                deleted.add(key)
    return {key: rows[key] for key in sorted(written)}, deleted


def _rows_touched(attempt: Attempt, epochs: set[int], now: float) -> list[GpuSeries]:
    """The attempt's rows a round at ``now`` may touch: the 10 s rows its points go to, the expired rows, then (a
    second read, once a minute) the rows those fold into."""
    near = Q(resolution=RESOLUTIONS[0], start__in={row_start(e, 0) for e in epochs})
    for resolution, span, keep in LEVELS:
        if keep is not None:
            near |= Q(resolution=resolution, start__lte=now - keep - span)
    found = list(GpuSeries.objects.filter(attempt=attempt).filter(near))
    targets = Q()
    for s in found:
        level = RESOLUTIONS.index(s.resolution)
        if row_expired(s.start, level, now):
            for coarser in range(level + 1, len(LEVELS)):  # a long gap folds on through more than one level
                targets |= Q(rank=s.rank, gpu=s.gpu, resolution=RESOLUTIONS[coarser],
                             start__in={row_start(p[0], coarser) for p in s.points})
    if targets:
        found += GpuSeries.objects.filter(attempt=attempt).filter(targets).exclude(pk__in=[s.pk for s in found])
    return found


@transaction.atomic
def gpu_points_record(*, attempt: Attempt, readings: list[tuple[int, str, str, list]], interval: float) -> None:
    """Store one round's readings of an attempt ([(rank, node, gpu, point)]) and update its running means. Writes
    the rows that change (normally each GPU's newest 10 s row, a few points) in one statement, creates and deletes
    the rows of a new or passed stretch."""
    if not readings:
        return
    attempt = Attempt.objects.select_for_update().get(pk=attempt.pk)
    _series_write(attempt, readings, now=max(point[0] for *_, point in readings))
    total = (attempt.gpu_util_mean or 0.0) * attempt.gpu_samples + sum(p[1] for *_, p in readings)
    attempt.gpu_samples += len(readings)
    attempt.gpu_util_mean = round(total / attempt.gpu_samples, 2)
    attempt.gpu_util_seconds += sum(p[1] for *_, p in readings) / 100.0 * interval
    attempt.save(update_fields=["gpu_samples", "gpu_util_mean", "gpu_util_seconds"])


def gpu_series_compact(*, now: float, limit: int = 20) -> int:
    """Fold the passed rows of attempts that no round folds any more (ended, or no longer read), as a round does
    for its own: an ended job's last hour at 10 s and last day at 1 min become 10 min points in time, so what is
    kept for its life is a few KB a GPU-day. At most ``limit`` attempts; how many were folded."""
    stale = Q()
    for resolution, span, keep in LEVELS:
        if keep is not None:
            stale |= Q(resolution=resolution, start__lte=now - keep - span)
    ids = list(GpuSeries.objects.filter(stale).order_by().values_list("attempt_id", flat=True).distinct()[:limit])
    for attempt_id in ids:
        with transaction.atomic():
            attempt = Attempt.objects.select_for_update().filter(pk=attempt_id).first()
            if attempt is not None:
                _series_write(attempt, [], now=now)
    return len(ids)


def _series_write(attempt: Attempt, readings: list[tuple[int, str, str, list]], *, now: float) -> None:
    found = _rows_touched(attempt, {point[0] for *_, point in readings}, now)
    by_key = {(s.rank, s.gpu, s.resolution, s.start): s for s in found}
    gpus: dict[tuple[int, str], tuple[str, list[list]]] = {(s.rank, s.gpu): (s.node, []) for s in found}
    rows_of: dict[tuple[int, str], dict[tuple, list]] = {}
    for s in found:
        rows_of.setdefault((s.rank, s.gpu), {})[(s.resolution, s.start)] = s.points
    for rank, node, gpu, point in readings:  # the reading's node, as the rows it writes name it
        points = gpus.get((rank, gpu), (node, []))[1]
        points.append(point)
        gpus[(rank, gpu)] = (node, points)
    new, changed, gone = [], [], []
    stamp = timezone.now()
    for (rank, gpu), (node, points) in gpus.items():
        written, deleted = series_add(rows_of.get((rank, gpu), {}), points, now)
        for (res, start), pts in written.items():
            row = by_key.get((rank, gpu, res, start))
            if row is None:
                new.append(GpuSeries(attempt=attempt, rank=rank, node=node, gpu=gpu, resolution=res, start=start,
                                     points=pts))
            else:
                row.points, row.updated_at = pts, stamp
                changed.append(row)
        gone += [by_key[(rank, gpu, *key)].pk for key in deleted if (rank, gpu, *key) in by_key]
    if gone:
        GpuSeries.objects.filter(pk__in=gone).delete()
    if changed:
        GpuSeries.objects.bulk_update(changed, ["points", "updated_at"])
    if new:
        GpuSeries.objects.bulk_create(new)


def gpus_changed_publish(job_ids: Iterable[int]) -> None:
    """After commit, tell the detail pages of these jobs that their GPU series changed (one message a round)."""
    ids = sorted(set(job_ids))
    if ids:
        from ..live_publisher import publish_gpu_changes

        transaction.on_commit(lambda: publish_gpu_changes(ids), robust=True)


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
