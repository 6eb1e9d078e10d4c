"""Benchmark: a scheduling pass on a realistic mix, and how its cost grows with the queue, on PostgreSQL.

    createdb -h 127.0.0.1 -U postgres jobsite_bench_realistic
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobsite_bench_realistic SECRET_KEY=... \
        .venv/bin/python bench/admission_realistic.py [--sizes 1000,5000,20000,50000 --repeat 3 --profile]

The world: 1,000 groups, each with a GPU quota of 6, a limit of 16 (preemptible jobs borrow) and a user quota of
4; 1,000 nodes × 8 GPUs, each full with one group's 4 running jobs (two of its first user's, two preemptible
low-priority ones of its second user, one of those over the group's quota). The pending jobs, spread evenly over
the groups, are of four users: the first two at their quota (they wait for it), the others at low, normal and
high priority, one in four preemptible. For each size it prints a steady pass (nothing changed since the last
one, so it reuses the last decision: ``scheduler.carry``): the median CPU seconds of this process, the wall time,
the queries and the load average; and, for reference, a fresh pass (one after any change); then the curve. The
process's collector is settled as the scheduler process's is (``jobsite.process_memory``; ``--collector-defaults``:
the interpreter's defaults, as the scheduler process ran before).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from jobs.choices import Phase, Priority, Resource  # noqa: E402
from jobs.models import Attempt, Group, GroupQuota, Image, InstanceType, Job  # noqa: E402
from jobsite import process_memory  # noqa: E402
from scheduler.carry import pass_memory_reset  # noqa: E402
from scheduler.passes import schedule_pass  # noqa: E402
from scheduler.values import Node  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_cpu import speed_line  # noqa: E402

GROUPS = 1000
CPU_GOAL_S = 0.1
QUERY_GOAL = 10
PRIORITIES = (Priority.LOW, Priority.NORMAL, Priority.HIGH)


class BenchBackend:
    """Only what a scheduling pass asks of a backend: its name and its nodes."""

    name = "bench-realistic"

    def __init__(self, nodes: list[Node]):
        self._nodes = nodes

    def nodes(self) -> list[Node]:
        return self._nodes


def fill(pending: int) -> BenchBackend:
    call_command("flush", "--noinput", verbosity=0)
    users = [get_user_model().objects.create_user(f"u{i}") for i in range(4 * GROUPS)]
    image = Image.objects.create(name="bench", url="busybox")
    gpu1 = InstanceType.objects.create(name="gpu-1", gpu=1)
    gpu2 = InstanceType.objects.create(name="gpu-2", gpu=2)
    made = Group.objects.bulk_create([Group(name=f"g{i:04d}") for i in range(GROUPS)])
    GroupQuota.objects.bulk_create([GroupQuota(group=g, resource=Resource.GPU, quota=6, limit=16, user_quota=4)
                                    for g in made])
    now = timezone.now()
    base = dict(image=image, image_url=image.url, command="train", status="Running", phase=Phase.RUNNING)
    running = []
    for n, g in enumerate(made):
        for k in range(4):
            preemptible = k >= 2
            running.append(Job(
                name=f"run-{g.pk}-{k}", group=g, user=users[4 * n + k // 2], instance_type=gpu2, gpu=2,
                priority=Priority.LOW if preemptible else Priority.NORMAL, preemptible=preemptible,
                over_quota=k == 3, queued_at=now - timedelta(hours=2), admitted_at=now - timedelta(hours=1, seconds=k),
                **base))
    running = Job.objects.bulk_create(running, batch_size=2000)
    attempts = Attempt.objects.bulk_create([
        Attempt(job=j, number=1, replicas=1, gpu=2, backend=BenchBackend.name, started_at=j.admitted_at,
                node=f"n{i // 4:04d}", placement={"0": {"node": f"n{i // 4:04d}",
                                                         "gpu_ids": [2 * (i % 4), 2 * (i % 4) + 1]}})
        for i, j in enumerate(running)
    ], batch_size=2000)
    for j, a in zip(running, attempts, strict=True):
        j.current_attempt = a
    Job.objects.bulk_update(running, ["current_attempt"], batch_size=2000)
    base.update(status="Pending", reason="", phase=Phase.PENDING)
    per_group = max(pending // GROUPS, 1)
    Job.objects.bulk_create([
        Job(name=f"wait-{g.pk}-{k}", group=g, user=users[4 * n + k % 4], instance_type=gpu1, gpu=1,
            priority=PRIORITIES[k % 3], preemptible=k % 4 == 1, queued_at=now - timedelta(seconds=per_group - k),
            **base)
        for n, g in enumerate(made) for k in range(per_group)
    ], batch_size=5000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return BenchBackend([Node(f"n{i:04d}", {"gpu": 8}, {"gpu": 8}, list(range(8))) for i in range(GROUPS)])


def steady(backend: BenchBackend, repeat: int, profile: bool) -> dict:
    clock = timezone.now()
    for _ in range(4):  # the first passes write the reasons and preempt; the later ones find nothing changed
        schedule_pass(backend=backend, now=clock)
    with connection.cursor() as cursor:  # as autovacuum would once the first passes have rewritten the queue
        cursor.execute("ANALYZE")
    schedule_pass(backend=backend, now=clock)
    cpu, wall, queries, carried = [], [], 0, []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as captured:
            t0, c0 = time.perf_counter(), time.process_time()
            carried.append(schedule_pass(backend=backend, now=clock).carried)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        queries = len(captured.captured_queries)
    fresh = []  # for reference: a pass that decides afresh (what any change anywhere costs the next pass)
    for _ in range(repeat):
        pass_memory_reset()
        with CaptureQueriesContext(connection) as captured:
            c0 = time.process_time()
            schedule_pass(backend=backend, now=clock)
            fresh.append(time.process_time() - c0)
        fresh_queries = len(captured.captured_queries)
    if profile:
        profiler = cProfile.Profile(time.process_time)
        schedule_pass(backend=backend, now=clock)
        profiler.runcall(schedule_pass, backend=backend, now=clock)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    print(f"  steady passes, CPU s each: {' '.join(f'{c:.3f}' for c in cpu)} (reused the last decision: "
          f"{sum(carried)}/{len(carried)}); fresh passes: {' '.join(f'{c:.3f}' for c in fresh)} CPU s, "
          f"{fresh_queries} queries", flush=True)
    return {"cpu": statistics.median(cpu), "wall": statistics.median(wall), "queries": queries,
            "load": os.getloadavg(), "fresh": statistics.median(fresh)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,5000,20000,50000", help="pending jobs, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one more steady pass")
    parser.add_argument("--collector-defaults", action="store_true",
                        help="leave the cyclic collector as the interpreter sets it (the scheduler process settles it)")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("Point DATABASE_URL at a PostgreSQL database made for this benchmark.")
    call_command("migrate", verbosity=0)
    if not args.collector_defaults:
        process_memory.settle()  # as the scheduler process does before it schedules
    print(speed_line(), flush=True)
    print(f"collector: {'the interpreter defaults' if args.collector_defaults else 'settled'} "
          f"(threshold {gc.get_threshold()}, {gc.get_freeze_count():,} objects frozen)", flush=True)
    curve = []
    for size in (int(s) for s in args.sizes.split(",")):
        backend = fill(size)
        r = steady(backend, args.repeat, args.profile)
        curve.append((size, r))
        print(f"{size:>7,} pending, {GROUPS:,} groups, {GROUPS:,} nodes: steady pass {r['cpu']:.3f} s CPU, "
              f"{r['wall']:.3f} s wall, {r['queries']} queries, load {' '.join(f'{x:.2f}' for x in r['load'])}"
              f"   goal: <= {CPU_GOAL_S} s CPU, <= {QUERY_GOAL} queries", flush=True)
    print("curve (pending: CPU s / queries): " + ", ".join(f"{s:,}: {r['cpu']:.3f} / {r['queries']}"
                                                           for s, r in curve), flush=True)
    print("fresh pass (pending: CPU s): " + ", ".join(f"{s:,}: {r['fresh']:.3f}" for s, r in curve), flush=True)


if __name__ == "__main__":
    main()
