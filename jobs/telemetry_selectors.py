"""Reading GPU telemetry back: an attempt's series per GPU, the tiers joined into one timeline."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    for s in GpuSeries.objects.filter(attempt=attempt).order_by("rank", "gpu", "resolution"):
        key = (s.rank, s.gpu)
        by_gpu.setdefault(key, GpuTimeline(rank=s.rank, node=s.node, gpu=s.gpu))
        tiers.setdefault(key, {})[s.resolution] = s.points
    for key, timeline in by_gpu.items():
        timeline.points = join_tiers(tiers[key])
    return sorted(by_gpu.values(), key=lambda t: (t.rank, t.gpu.zfill(4)))
