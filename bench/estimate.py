"""Benchmark: the start-time estimate of every pending job, as a scheduling pass computes it (pure: no database).

    .venv/bin/python bench/estimate.py                 # 1,000 and 10,000 pending jobs
    .venv/bin/python bench/estimate.py --pending 1000 --repeat 15

The demo world: phusers (4 GPU quota, 4 per user; bob, pan, lin) and research (8 GPU quota, 4 per user; lin, and
here a few more users), on the local backend's one node of 8 GPUs, full. The pending jobs are 70 / 20 / 10 %
gpu-1 / gpu-2 / gpu-4, spread over the users and both groups, a few high-priority ones and a few backing off.
Two sets of expected durations: every job to its deadline (1 day: few starts within the 30-day horizon), and
from history (10 minutes to 8 hours: most jobs start within it, the expensive case). Prints the median and the
slowest of ``--repeat`` runs of ``estimate()`` given the pass's own decision (what a pass adds), and of the pass's
``decide()`` for comparison, with how many jobs got an estimate and how many steps the simulation took.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler import estimate as estimate_module  # noqa: E402
from scheduler.core import GroupState, QueuedJob, QuotaLimits, ReplicaPlacement, decide  # noqa: E402
from scheduler.estimate import DEADLINES, HISTORY, HeldJob, estimate  # noqa: E402
from scheduler.values import Node  # noqa: E402

NOW = datetime(2026, 3, 2, 9, 17, 23, tzinfo=UTC)
PH, RS = 1, 2
USERS = {PH: [1, 2, 3], RS: [3, 4, 5, 6, 7]}  # bob, pan, lin; lin and four more researchers
SHAPES = [(1, 0.7), (2, 0.2), (4, 0.1)]  # GPUs per job, share


def world(pending: int, seed: int = 1):
    rnd = random.Random(seed)
    groups = {
        PH: GroupState(PH, "phusers", {"gpu": QuotaLimits(4, None, 4)}),
        RS: GroupState(RS, "research", {"gpu": QuotaLimits(8, None, 4)}),
    }
    node = Node("local", {"gpu": 8}, {"gpu": 8}, list(range(8)))
    holding = []
    for i, (gid, user, gpu) in enumerate([(PH, 1, 2), (PH, 2, 1), (RS, 3, 4), (RS, 4, 1)]):
        ids = tuple(node.free_gpu_ids[:gpu])
        node.free_gpu_ids = node.free_gpu_ids[gpu:]
        node.free["gpu"] -= gpu
        groups[gid].usage["gpu"] = groups[gid].usage.get("gpu", 0) + gpu
        per_user = groups[gid].user_usage.setdefault(user, {})
        per_user["gpu"] = per_user.get("gpu", 0) + gpu
        holding.append(HeldJob(100_000 + i, gid, user, 1, {"gpu": gpu}, NOW - timedelta(minutes=rnd.randint(1, 600)),
                               (ReplicaPlacement("local", ids),)))
    queued = []
    for i in range(pending):
        gid = PH if rnd.random() < 0.5 else RS
        gpu = rnd.choices([s for s, _ in SHAPES], [w for _, w in SHAPES])[0]
        queued.append(QueuedJob(
            id=i + 1, name=f"train-{rnd.randint(1, 40)}", group_id=gid, user_id=rnd.choice(USERS[gid]),
            priority=100 if rnd.random() < 0.05 else 50, queued_at=NOW - timedelta(seconds=pending - i),
            replicas=1, request={"gpu": gpu, "cpu": 8000 * gpu, "memory": (32 << 30) * gpu},
            not_before=NOW + timedelta(minutes=rnd.randint(1, 60)) if rnd.random() < 0.02 else None,
        ))
    by_deadline = {j: (86400.0, DEADLINES) for j in [h.id for h in holding] + [q.id for q in queued]}
    by_history = {j: (float(rnd.randint(600, 8 * 3600)), HISTORY) for j in by_deadline}
    return groups, queued, [node], holding, by_deadline, by_history


def timed(fn, repeat: int) -> tuple[float, float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), max(times), result


def count_steps(fn) -> int:
    """How many simulated moments ``fn`` asked decide() about (decide calls inside the estimate)."""
    calls = 0
    real = estimate_module.decide

    def counting(*args, **kwargs):
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    estimate_module.decide = counting
    try:
        fn()
    finally:
        estimate_module.decide = real
    return calls


def bench(pending: int, repeat: int) -> None:
    groups, queued, nodes, holding, by_deadline, by_history = world(pending)
    outcomes = decide(groups, queued, nodes, (), now=NOW)
    med, worst, _ = timed(lambda: decide(groups, queued, nodes, (), now=NOW), repeat)
    print(f"  {pending:6d} pending  decide() itself                 {med:8.1f} {worst:8.1f}")
    for label, durations in (("by deadlines", by_deadline), ("by history", by_history)):
        def run(durations=durations):
            return estimate(groups, queued, nodes, holding, durations, NOW, outcomes=outcomes)

        med, worst, result = timed(run, repeat)
        started = sum(1 for e in result.values() if e is not None)
        print(f"  {pending:6d} pending  estimate(), {label:12s}       {med:8.1f} {worst:8.1f}"
              f"   ({started} start within 30 days; {count_steps(run)} decide() calls)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pending", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    print(f"estimate() per pass, given the pass's decision; median / slowest of {args.repeat} runs, ms")
    for pending in args.pending:
        bench(pending, args.repeat)


if __name__ == "__main__":
    main()
