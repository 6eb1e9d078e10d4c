"""Benchmark: Kueue's baseline scenario replayed on the simulated backend, against the goals of issue 12.

    .venv/bin/python bench/replay_kueue.py                 # one replay of bench/workloads/kueue_baseline.jsonl
    .venv/bin/python bench/replay_kueue.py --repeat 3      # the median of three
    .venv/bin/python bench/replay_kueue.py --nodes 5 --gpus-per-node 120

The workload (``bench/workloads/make_kueue_baseline.py`` writes it): 30 groups with a GPU quota of 20 and a
borrowing limit of 120, 15,000 preemptible jobs (per group 350 × 1 GPU for 0.2 s, 100 × 5 GPUs for 0.5 s,
50 × 20 GPUs for 1 s, arriving over a minute), on 30 nodes of 20 GPUs. ``manage.py replay`` runs it in virtual
time through the scheduler's own decisions (``scheduler.simulation``); this prints the wall time of that work (and
the CPU time, which a busy machine does not inflate) against a third of the 351 s Kueue's own baseline takes, and
the share of the GPUs doing useful work over the makespan against 85 %.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")

import django  # noqa: E402

django.setup()  # settings only: the replay touches no database

from scheduler.simulation.replay import Replay  # noqa: E402
from scheduler.simulation.report import fmt_seconds, report_lines  # noqa: E402
from scheduler.simulation.workload import load_workload  # noqa: E402

WORKLOAD = Path(__file__).resolve().parent / "workloads" / "kueue_baseline.jsonl"
KUEUE_WALL = 351.0  # seconds: Kueue's baseline (its test's recorded average)
WALL_GOAL = KUEUE_WALL / 3
USAGE_GOAL = 0.85


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, default=WORKLOAD)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--gpus-per-node", type=int)
    parser.add_argument("--details", action="store_true", help="also print the replay's own report")
    args = parser.parse_args()

    workload = load_workload(args.workload)
    results = []
    for _ in range(args.repeat):
        run = Replay(workload, nodes=args.nodes, gpus_per_node=args.gpus_per_node)
        results.append(run.run())
    result = sorted(results, key=lambda r: r.wall_seconds)[len(results) // 2]
    wall = statistics.median(r.wall_seconds for r in results)
    cpu = statistics.median(r.cpu_seconds for r in results)
    if args.details:
        print("\n".join(report_lines(result, layout=run.layout)))
        print()
    print(f"{args.workload.name}: {result.jobs:,} jobs on {run.layout} ({result.capacity:,} GPUs), "
          f"median of {args.repeat}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    rows = [
        ("wall time of the scheduler's work", f"{wall:.1f} s (CPU {cpu:.1f} s)",
         f"≤ {WALL_GOAL:.0f} s (a third of Kueue's {KUEUE_WALL:.0f} s)", wall <= WALL_GOAL),
        ("GPU usage (useful GPU-s / capacity × makespan)", f"{100 * result.usage:.1f} %",
         f"≥ {100 * USAGE_GOAL:.0f} %", result.usage >= USAGE_GOAL),
        ("virtual makespan / ideal", f"{fmt_seconds(result.makespan)} / {fmt_seconds(result.ideal_makespan)}", "",
         None),
        ("jobs/s (completed / wall)", f"{result.jobs_per_second:,.0f}", "", None),
        ("preemptions", f"{result.preemptions:,}", "", None),
    ]
    for name in ("small", "medium", "large"):
        waits = result.class_waits.get(name, [])
        if waits:
            rows.append((f"mean wait, {name}", fmt_seconds(sum(waits) / len(waits)), "", None))
    if result.livelocks:
        rows.append(("moments cut short (passes kept preempting)", f"{result.livelocks:,}", "0", False))
    print(f"{'what':<48} {'figure':<24} goal")
    for what, figure, goal, met in rows:
        mark = "" if met is None else ("  met" if met else "  MISSED")
        print(f"{what:<48} {figure:<24} {goal}{mark}")


if __name__ == "__main__":
    main()
