"""Benchmark: how close the estimated start times come to the real ones, replaying a workload in virtual time.

    .venv/bin/python bench/estimate_replay.py                  # 1,000 jobs
    .venv/bin/python bench/estimate_replay.py --jobs 300 --seed 2

A generated workload (seeded): jobs arriving over a few days at about 90 % of the cluster's GPU-hours, 70 / 20 /
10 % asking 1 / 2 / 4 GPUs, 5 % of high priority, from seven users in two groups (phusers: 8 GPU quota, 4 per
user; research: 12 GPU quota, 6 per user) on two nodes of 8 GPUs. Every user repeats a handful of kinds of job
(same name, same instance type) whose run times scatter around the kind's own typical time (10 minutes to 6 hours),
so the history of similar jobs says something; 60 % of the jobs keep the default deadline of a day, the others set
about three times their typical run time. Jobs that run past their deadline are stopped at it.

A discrete-event simulation in virtual time runs a scheduling pass at every arrival and every end, admitting with
``decide()`` itself. At each job's arrival pass, a job that has to wait gets its estimate as the scheduler would
compute it (``estimate()`` given the pass's decision, durations refined by the history of the jobs ended so far,
as ``jobs.selectors.job_duration_history`` reads it); it is compared with the start the job actually gets, and the
median and 90th percentile of the absolute error are printed by the estimate's basis, next to the same with
deadlines only (no history).
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import statistics
import sys
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")

import django  # noqa: E402

django.setup()  # the history's arithmetic lives with its query in jobs.selectors; no database is touched

from jobs.durations import (  # noqa: E402
    HISTORY_SAMPLES,
    LEVELS,
    DurationHistory,
    history_from_runs,
    kinds_of,
)
from scheduler.core import GroupState, QueuedJob, QuotaLimits, ReplicaPlacement, Verdict, decide  # noqa: E402
from scheduler.estimate import DEADLINES, HISTORY, HeldJob, estimate  # noqa: E402
from scheduler.values import Node  # noqa: E402

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
PH, RS = 1, 2
MEMBERS = {PH: ["bob", "pan", "lin"], RS: ["lin", "ana", "kai", "max"]}
GPUS = {"gpu-1": 1, "gpu-2": 2, "gpu-4": 4}
SHARES = {"gpu-1": 0.7, "gpu-2": 0.2, "gpu-4": 0.1}
NODES, GPUS_PER_NODE = 2, 8
DEFAULT_DEADLINE = 86400


@dataclass
class Spec:
    id: int
    arrival: datetime
    group: int
    user: int
    name: str
    itype: str
    priority: int
    runtime: float  # what it will really run, seconds (stopped at its deadline)
    deadline: int


@dataclass
class Kind:
    name: str
    itype: str
    typical: float
    deadline: int


def workload(n: int, seed: int) -> list[Spec]:
    rnd = random.Random(seed)
    users = sorted({u for members in MEMBERS.values() for u in members})
    uid = {u: i + 1 for i, u in enumerate(users)}
    kinds: dict[tuple[int, str], list[Kind]] = {}
    for gid, members in MEMBERS.items():
        for user in members:
            kinds[(gid, user)] = []
            for k in range(rnd.randint(2, 5)):
                itype = rnd.choices(list(SHARES), list(SHARES.values()))[0]
                typical = min(max(rnd.lognormvariate(8.0, 1.0), 600), 6 * 3600)  # median ~50 min
                deadline = DEFAULT_DEADLINE if rnd.random() < 0.6 else int(-(-3 * typical // 3600) * 3600)
                kinds[(gid, user)].append(Kind(f"{user}-{itype}-{k}", itype, typical, deadline))
    specs = []
    draws = [(gid, user, rnd.choice(kinds[(gid, user)])) for _ in range(n)
             for gid in [rnd.choice([PH, RS, RS])] for user in [rnd.choice(MEMBERS[gid])]]
    gpu_hours = sum(GPUS[k.itype] * k.typical for _, _, k in draws) / 3600
    span = gpu_hours / (0.9 * NODES * GPUS_PER_NODE) * 3600  # seconds for ~90 % load
    at = T0
    for i, (gid, user, kind) in enumerate(draws):
        at += timedelta(seconds=rnd.expovariate(n / span))
        runtime = kind.typical * rnd.lognormvariate(0, 0.25)
        specs.append(Spec(i + 1, at, gid, uid[user], kind.name, kind.itype, 100 if rnd.random() < 0.05 else 50,
                          runtime, kind.deadline))
    return specs


@dataclass
class History:
    """The last ``HISTORY_SAMPLES`` run times per key, as the selector reads them from the attempts."""

    runs: dict[tuple, deque] = field(default_factory=lambda: defaultdict(lambda: deque(maxlen=HISTORY_SAMPLES)))

    def record(self, spec: Spec, seconds: float) -> None:
        # The instance type as ``expected`` asks for it (its index): the same keys the product reads.
        keys = kinds_of(spec.user, spec.group, spec.name, list(GPUS).index(spec.itype))
        for level, key in zip(LEVELS, keys, strict=True):
            self.runs[(level, key)].appendleft(seconds)  # newest first, as the selector reads them

    def snapshot(self) -> DurationHistory:
        return history_from_runs({k: list(v) for k, v in self.runs.items()})


def expected(history: DurationHistory | None, spec: Spec) -> tuple[float, str]:
    if history is None:
        return float(spec.deadline), DEADLINES
    return history.expected(user_id=spec.user, group_id=spec.group, name=spec.name,
                            instance_type_id=list(GPUS).index(spec.itype), deadline=spec.deadline)


def replay(specs: list[Spec]) -> dict[str, dict[int, tuple[datetime | None, str]]]:
    """Run the workload; returns, per estimating mode, each waiting job's estimate at its arrival, and (under
    "actual") each job's real start."""
    groups = {PH: GroupState(PH, "phusers", {"gpu": QuotaLimits(8, None, 4)}),
              RS: GroupState(RS, "research", {"gpu": QuotaLimits(12, None, 6)})}
    nodes = [Node(f"n{i}", {"gpu": GPUS_PER_NODE}, {"gpu": GPUS_PER_NODE}, list(range(GPUS_PER_NODE)))
             for i in range(NODES)]
    by_name = {n.name: n for n in nodes}
    by_id = {s.id: s for s in specs}
    queued: dict[int, QueuedJob] = {}
    running: dict[int, tuple[HeldJob, datetime]] = {}
    history = History()
    events: list[tuple[datetime, int, int]] = [(s.arrival, 1, s.id) for s in specs]  # (time, 0 end / 1 arrival, id)
    heapq.heapify(events)
    result: dict[str, dict[int, tuple[datetime | None, str]]] = {"history": {}, "deadlines": {}, "actual": {}}

    def charge(gid: int, user: int, gpu: int, sign: int) -> None:
        g = groups[gid]
        g.usage["gpu"] = g.usage.get("gpu", 0) + sign * gpu
        per_user = g.user_usage.setdefault(user, {})
        per_user["gpu"] = per_user.get("gpu", 0) + sign * gpu

    while events:
        now = events[0][0]
        arrived = []
        while events and events[0][0] == now:
            _, kind, job_id = heapq.heappop(events)
            spec = by_id[job_id]
            if kind == 0:  # an end
                held, _ = running.pop(job_id)
                charge(spec.group, spec.user, GPUS[spec.itype], -1)
                for p in held.placement:
                    node = by_name[p.node]
                    node.free["gpu"] += GPUS[spec.itype]
                    node.free_gpu_ids = sorted(set(node.free_gpu_ids) | set(p.gpu_ids))
                history.record(spec, (now - held.admitted_at).total_seconds())
            else:
                queued[job_id] = QueuedJob(job_id, spec.name, spec.group, spec.user, spec.priority, spec.arrival, 1,
                                           {"gpu": GPUS[spec.itype]})
                arrived.append(job_id)
        # One pass: decide, then (as the pass does) the estimates of the jobs left waiting.
        outcomes = decide(groups, list(queued.values()), nodes, (), now=now)
        if arrived:
            known = history.snapshot()
            for mode, hist in (("history", known), ("deadlines", None)):
                durations = {j: expected(hist, by_id[j]) for j in list(queued) + list(running)}
                estimates = estimate(groups, list(queued.values()), nodes, [h for h, _ in running.values()],
                                     durations, now, outcomes=outcomes)
                for o in outcomes:
                    if o.job_id in arrived and o.verdict == Verdict.WAIT:
                        e = estimates.get(o.job_id)
                        result[mode][o.job_id] = (e.start, e.basis) if e else (None, "")
        for o in outcomes:
            if o.verdict != Verdict.ADMIT:
                continue
            spec = by_id[o.job_id]
            del queued[o.job_id]
            charge(spec.group, spec.user, GPUS[spec.itype], +1)
            for p in o.placement:
                node = by_name[p.node]
                node.free["gpu"] -= GPUS[spec.itype]
                node.free_gpu_ids = [g for g in node.free_gpu_ids if g not in p.gpu_ids]
            held = HeldJob(spec.id, spec.group, spec.user, 1, {"gpu": GPUS[spec.itype]}, now, tuple(
                ReplicaPlacement(p.node, p.gpu_ids) for p in o.placement))
            end = now + timedelta(seconds=min(spec.runtime, spec.deadline))
            running[spec.id] = (held, end)
            heapq.heappush(events, (end, 0, spec.id))
            result["actual"][spec.id] = (now, "")
    return result


def fmt(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m {seconds % 60:02d}s"


def errors(estimates: dict[int, tuple[datetime | None, str]], actual: dict, basis: str | None) -> tuple[list, int]:
    found, beyond = [], 0
    for job_id, (start, b) in estimates.items():
        if start is None:
            beyond += basis is None
            continue
        if basis is None or b == basis:
            found.append(abs((start - actual[job_id][0]).total_seconds()))
    return sorted(found), beyond


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    specs = workload(args.jobs, args.seed)
    t = time.perf_counter()
    result = replay(specs)
    took = time.perf_counter() - t
    actual = result["actual"]
    days = (specs[-1].arrival - T0).total_seconds() / 86400
    waited = len(result["history"])
    print(f"replay: {len(specs)} jobs arriving over {days:.1f} days on {NODES} nodes x {GPUS_PER_NODE} GPUs; "
          f"{waited} had to wait ({took:.1f} s)")
    print("absolute error of the estimate made at arrival, against the actual start")
    print(f"  {'estimates':34s} {'jobs':>5s} {'median':>9s} {'p90':>9s}")
    for label, mode, basis in (("by deadlines", "history", DEADLINES), ("by history", "history", HISTORY),
                               ("all (as the scheduler shows them)", "history", None),
                               ("deadlines only, no history", "deadlines", None)):
        found, _ = errors(result[mode], actual, basis)
        if not found:
            print(f"  {label:34s} {0:5d}")
            continue
        p90 = found[min(len(found) - 1, int(0.9 * len(found)))]
        print(f"  {label:34s} {len(found):5d} {fmt(statistics.median(found)):>9s} {fmt(p90):>9s}")
    _, beyond = errors(result["history"], actual, None)
    print(f"  (not within 30 days: {beyond})")
    # For scale: how long the jobs that waited did wait.
    arrival = {s.id: s.arrival for s in specs}
    waits = [(actual[j][0] - arrival[j]).total_seconds() for j in result["history"]]
    if waits:
        print(f"  median wait of the jobs that waited: {fmt(statistics.median(waits))}")


if __name__ == "__main__":
    main()
