"""Reading GPU telemetry back: an attempt's series per GPU, the tiers joined into one timeline."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import F

from .choices import RESOURCE_PHASES
from .models import Attempt, GpuSeries


@dataclass
class GpuTimeline:
    rank: int
    node: str
    gpu: str
    points: list[list] = field(default_factory=list)

    @property
    def latest(self) -> list | None:
        return self.points[-1] if self.points else None


def join_tiers(tiers: dict[int, list[list]]) -> list[list]:
    """Pure: the coarse tiers up to where the finer ones begin, then the finer ones: one timeline, oldest first."""
    out: list[list] = []
    for resolution in sorted(tiers, reverse=True):  # 600, 60, 10
        points = tiers[resolution]
        if not points:
            continue
        begin = points[0][0]
        out = [p for p in out if p[0] + resolution <= begin] + list(points)
    return out


def gpu_timelines(attempt: Attempt | None) -> list[GpuTimeline]:
    """One timeline per (rank, GPU) of the attempt, in rank and GPU order."""
    if attempt is None:
        return []
    by_gpu: dict[tuple[int, str], GpuTimeline] = {}
    tiers: dict[tuple[int, str], dict[int, list]] = {}
    for s in GpuSeries.objects.filter(attempt=attempt).order_by("rank", "gpu", "resolution", "start"):
        key = (s.rank, s.gpu)
        by_gpu.setdefault(key, GpuTimeline(rank=s.rank, node=s.node, gpu=s.gpu))
        tiers.setdefault(key, {}).setdefault(s.resolution, []).extend(s.points)  # a level's rows, oldest first
    for key, timeline in by_gpu.items():
        timeline.points = join_tiers(tiers[key])
    return sorted(by_gpu.values(), key=lambda t: (t.rank, t.gpu.zfill(4)))


# --- idle GPU time and the utilisation page's heat -----------------------------------------------------------------


def idle_seconds(tiers: dict[int, list[list]], threshold: float) -> float:
    """Pure: seconds one GPU spent under ``threshold`` SM %, from its stored tiers ({resolution: points}). The tiers
    are joined as ``join_tiers`` does; each point stands for its tier's resolution (10 s, 1 min or 10 min) and a
    coarse point counts as idle when its mean is under the threshold."""
    out: list[tuple[list, int]] = []
    for resolution in sorted(tiers, reverse=True):
        points = tiers[resolution]
        if not points:
            continue
        begin = points[0][0]
        out = [(p, r) for p, r in out if p[0] + r <= begin] + [(p, resolution) for p in points]
    return float(sum(r for p, r in out if p[1] < threshold))


HEAT_LEVELS = ((75.0, "busy"), (30.0, "some"))  # SM % from which a cell is "busy", "some"; else "low" or "idle"


def heat_level(sm: float, threshold: float) -> str:
    """Pure: the colour class of a GPU's SM %: idle (under the idle threshold), low, some, busy."""
    if sm < threshold:
        return "idle"
    return next((name for floor, name in HEAT_LEVELS if sm >= floor), "low")


def heat_cells(rows: list[tuple[str, str, list[list]]], threshold: float) -> dict[str, list[dict]]:
    """Pure: per node, its GPUs' newest SM % from ``rows`` ([(node, gpu, 10 s points)]), in GPU order; a GPU read
    by more than one row (an attempt ending as another begins) keeps the newest point."""
    newest: dict[tuple[str, str], list] = {}
    for node, gpu, points in rows:
        if points and (newest.get((node, gpu)) is None or points[-1][0] > newest[(node, gpu)][0]):
            newest[(node, gpu)] = points[-1]
    out: dict[str, list[dict]] = {}
    for (node, gpu), p in sorted(newest.items(), key=lambda kv: (kv[0][0], kv[0][1].zfill(4))):
        out.setdefault(node, []).append({"gpu": gpu, "sm": p[1], "at": p[0], "level": heat_level(p[1], threshold)})
    return out


def node_gpu_heat(threshold: float) -> dict[str, list[dict]]:
    """Per node name, the latest SM % of its GPUs from the newest 10 s points of the attempts holding resources."""
    rows = GpuSeries.objects.filter(resolution=10, attempt__job__phase__in=RESOURCE_PHASES,
                                    attempt__job__current_attempt=F("attempt")).values_list("node", "gpu", "points")
    # (each GPU's 10 s rows: the newest point of all of them wins)
    return heat_cells(list(rows), threshold)
