"""The figures of a replay, in lines to print: its report, and the waits of a "what if" side by side."""

from __future__ import annotations

import math
from collections.abc import Mapping

from .history import History
from .replay import MAX_ROUNDS, ReplayResult


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(math.ceil(p / 100 * len(ordered)) - 1, 0)]


def wait_summary(values: list[float]) -> tuple[float, float, float] | None:
    """(p50, p90, max) of waits, None without any."""
    if not values:
        return None
    return percentile(values, 50), percentile(values, 90), max(values)


def fmt_seconds(s: float) -> str:
    if s < 10:
        return f"{s:.2f} s"
    if s < 3600:
        return f"{s:.1f} s"
    return f"{s / 3600:.1f} h"


def report_lines(result: ReplayResult, *, layout: str) -> list[str]:
    lines = [
        f"jobs: {result.jobs:,} ({result.succeeded:,} completed, {result.inadmissible:,} inadmissible, "
        f"{result.preemptions:,} preemptions) on {layout} = {result.capacity:,} GPUs",
        f"wall time (the scheduler's own work): {result.wall_seconds:.2f} s (CPU {result.cpu_seconds:.2f} s), "
        f"{result.jobs_per_second:,.0f} jobs/s ({result.steps:,} moments, {result.decisions:,} decide() calls"
        + (f", {result.livelocks:,} moments cut short after {MAX_ROUNDS} passes that kept preempting"
           if result.livelocks else "") + ")",
        f"virtual makespan: {fmt_seconds(result.makespan)}",
        f"ideal makespan (GPU-seconds {result.useful_gpu_seconds:,.0f} / {result.capacity:,} GPUs): "
        f"{fmt_seconds(result.ideal_makespan)}",
        f"GPU usage: {100 * result.usage:.1f} % (useful GPU-seconds / capacity × makespan; held, preempted work "
        f"included: {100 * result.held_usage:.1f} %)",
        "waits per group (submit → first start): p50 / p90 / max",
    ]
    width = max((len(g) for g in result.waits), default=5)
    for group, values in sorted(result.waits.items()):
        summary = wait_summary(values)
        shown = " / ".join(fmt_seconds(v) for v in summary) if summary else "no job started"
        lines.append(f"  {group:<{width}}  {len(values):>6} jobs  {shown}")
    if len(result.class_waits) > 1:
        lines.append("waits per job name: p50 / p90 / max (mean)")
        width = max(len(n) for n in result.class_waits)
        for name, values in sorted(result.class_waits.items()):
            p50, p90, most = wait_summary(values)
            lines.append(f"  {name:<{width}}  {len(values):>6} jobs  {fmt_seconds(p50)} / {fmt_seconds(p90)} / "
                         f"{fmt_seconds(most)} ({fmt_seconds(sum(values) / len(values))})")
    return lines

def compare_lines(history: History, actual: ReplayResult, changed: ReplayResult, quotas: Mapping[str, int]
                  ) -> list[str]:
    """Waits per group side by side: as they were, replayed under the actual quotas, replayed under the changed."""
    def cell(values: list[float]) -> str:
        summary = wait_summary(values)
        return " / ".join(fmt_seconds(v) for v in summary) if summary else "-"

    groups = sorted(set(actual.waits) | set(history.observed))
    width = max([len(g) for g in groups] + [5])
    change = ", ".join(f"{g}={q}" for g, q in sorted(quotas.items())) or "none"
    lines = [
        f"{len(history.workload.jobs):,} jobs queued since {history.since:%Y-%m-%d %H:%M} that ran and ended; "
        f"cluster: {history.cluster}",
        f"changed GPU quotas: {change}",
        f"makespan {fmt_seconds(actual.makespan)} → {fmt_seconds(changed.makespan)}, GPU usage "
        f"{100 * actual.usage:.1f} % → {100 * changed.usage:.1f} %, preemptions {actual.preemptions} → "
        f"{changed.preemptions}",
        "waits per group, p50 / p90 / max:",
        f"  {'group':<{width}}  {'jobs':>5}  {'as they were':<28}  {'replayed, actual quotas':<28}  "
        f"replayed, changed quotas",
    ]
    for g in groups:
        lines.append(f"  {g:<{width}}  {len(history.observed.get(g, [])):>5}  {cell(history.observed.get(g, [])):<28}"
                     f"  {cell(actual.waits.get(g, [])):<28}  {cell(changed.waits.get(g, []))}")
    return lines
