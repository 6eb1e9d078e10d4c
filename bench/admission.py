"""Benchmark: admission by queue heads, with 50,000 pending jobs in 1,000 groups on PostgreSQL.

    createdb -h 127.0.0.1 -U postgres jobsite_bench_admission
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobsite_bench_admission SECRET_KEY=... \
        .venv/bin/python bench/admission.py [--groups 1000 --per-group 50 --repeat 5]

The database is emptied and refilled for each of two worlds: "quota" (every group's GPU quota is held by its 4
running jobs, no capacity check: each group's head waits for group quota) and "capacity" (1,000 nodes × 8 GPUs,
all taken by the running jobs, quotas larger: each head waits for cluster capacity). In each it prints, beside the
goal: ``decide()`` alone over every pending job and over what a pass reads (the heads), a steady pass (nothing
changed since the last one) and a cold pass (every waiting job's reason changed before it, as after a mass
requeue or an upgrade): the median of ``--repeat`` runs, the queries of one, and the events the cold pass wrote.
"""

from __future__ import annotations

import argparse
import os
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
from django.db import connection, transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

from jobs.choices import Phase, Resource  # noqa: E402
from jobs.models import Attempt, Group, GroupQuota, Image, InstanceType, Job, JobEvent  # noqa: E402
from scheduler.core import QueuedJob, decide  # noqa: E402
from scheduler.passes import schedule_pass  # noqa: E402
from scheduler.snapshot import QUEUED_FIELDS, snapshot  # noqa: E402
from scheduler.values import Node  # noqa: E402

PASS_GOAL_MS = 100


class BenchBackend:
    """Only what a scheduling pass asks of a backend: its name and its nodes (nothing is admitted here)."""

    def __init__(self, name: str, nodes: list[Node]):
        self.name = name
        self._nodes = nodes

    def nodes(self) -> list[Node]:
        return self._nodes


def fill(*, groups: int, per_group: int, capacity: bool) -> BenchBackend:
    call_command("flush", "--noinput", verbosity=0)
    users = [get_user_model().objects.create_user(f"u{i}") for i in range(50)]
    image = Image.objects.create(name="bench", url="busybox")
    gpu1 = InstanceType.objects.create(name="gpu-1", gpu=1)
    gpu2 = InstanceType.objects.create(name="gpu-2", gpu=2)
    quota = 16 if capacity else 8
    made = Group.objects.bulk_create([Group(name=f"g{i:04d}") for i in range(groups)])
    GroupQuota.objects.bulk_create([GroupQuota(group=g, resource=Resource.GPU, quota=quota, user_quota=8)
                                    for g in made])
    now = timezone.now()
    base = dict(image=image, image_url=image.url, command="train", status="Running")
    running = Job.objects.bulk_create([
        Job(name=f"run-{g.pk}-{k}", group=g, user=users[(g.pk + k) % 50], instance_type=gpu2, gpu=2,
            phase=Phase.RUNNING, queued_at=now - timedelta(hours=2), admitted_at=now - timedelta(hours=1), **base)
        for g in made for k in range(4)
    ], batch_size=2000)
    backend = "bench-capacity" if capacity else "bench-quota"
    attempts = Attempt.objects.bulk_create([
        Attempt(job=j, number=1, replicas=1, gpu=2, backend=backend, started_at=j.admitted_at,
                node=f"n{i // 4:04d}", placement={"0": {"node": f"n{i // 4:04d}",
                                                         "gpu_ids": [2 * (i % 4), 2 * (i % 4) + 1]}})
        for i, j in enumerate(running)
    ], batch_size=2000)
    for j, a in zip(running, attempts, strict=True):
        j.current_attempt = a
    Job.objects.bulk_update(running, ["current_attempt"], batch_size=2000)
    base.update(status="Pending", reason="", phase=Phase.PENDING)
    Job.objects.bulk_create([
        Job(name=f"wait-{g.pk}-{k}", group=g, user=users[(g.pk * 7 + k) % 50], instance_type=gpu1, gpu=1,
            queued_at=now - timedelta(seconds=per_group - k), **base)
        for g in made for k in range(per_group)
    ], batch_size=5000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    nodes = [Node(f"n{i:04d}", {"gpu": 8}, {"gpu": 8}, list(range(8))) for i in range(groups)] if capacity else []
    return BenchBackend(backend, nodes)


def median_ms(fn, repeat: int, before=None) -> tuple[float, float, int]:
    """Median wall and CPU (this process) milliseconds of ``repeat`` runs of ``fn`` (``before`` untimed ahead of
    each), and the queries of the last one. On a shared machine the CPU time says more than the wall time."""
    wall, cpu = [], []
    queries = [0]

    def count(execute, sql, params, many, context):
        queries[0] += 1
        return execute(sql, params, many, context)

    for _ in range(repeat):
        if before:
            before()
        queries[0] = 0
        with connection.execute_wrapper(count):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.process_time() - c0) * 1000)
    return statistics.median(wall), statistics.median(cpu), queries[0]


def row(label: str, measured: tuple[float, float, int], goal: str) -> None:
    wall, cpu, queries = measured
    print(f"  {label:<46} {wall:9.1f} ms ({cpu:8.1f} ms CPU) {queries:6d} queries   goal: {goal}", flush=True)


def all_pending():
    return [
        QueuedJob(id=r[0], name=r[1], group_id=r[2], user_id=r[3], priority=r[4], queued_at=r[5], replicas=r[6],
                  request={"gpu": r[7], "cpu": r[8], "memory": r[9]}, preemptible=r[10], not_before=r[14])
        for r in Job.objects.filter(phase=Phase.PENDING).values_list(*QUEUED_FIELDS)
    ]


def measure(label: str, backend: BenchBackend, repeat: int) -> None:
    pending = Job.objects.filter(phase=Phase.PENDING).count()
    print(f"{label}: {pending:,} pending jobs in {Group.objects.count():,} groups, "
          f"{Job.objects.filter(phase=Phase.RUNNING).count():,} running, {len(backend.nodes()):,} nodes", flush=True)
    clock = timezone.now()

    def cold_reset() -> None:  # every waiting job shows another reason than the pass will give it
        Job.objects.filter(phase=Phase.PENDING).update(reason="Queued", message="")

    events = JobEvent.objects.count()
    row("first pass (every job's reason set)", median_ms(lambda: schedule_pass(backend=backend, now=clock), 1),
        "one transition per group head, not per job")
    with transaction.atomic():
        snap = snapshot(backend)
    everyone = all_pending()
    row(f"decide() alone, all {len(everyone):,} pending jobs",
        median_ms(lambda: decide(snap.groups, everyone, snap.nodes, snap.running, now=clock), repeat),
        "(for comparison)")
    row(f"decide() alone, the {len(snap.queued):,} jobs a pass reads",
        median_ms(lambda: decide(snap.groups, snap.queued, snap.nodes, snap.running, now=clock), repeat),
        "(for comparison)")
    row("steady pass", median_ms(lambda: schedule_pass(backend=backend, now=clock), repeat),
        f"<= {PASS_GOAL_MS} ms, queries independent of the pending jobs")
    events_before = JobEvent.objects.count()
    row("cold pass (every waiting job's reason changed)",
        median_ms(lambda: schedule_pass(backend=backend, now=clock), repeat, before=cold_reset),
        "one transition per group head, not per job")
    print(f"  events written: first pass {events_before - events:,}, {repeat} cold passes "
          f"{JobEvent.objects.count() - events_before:,} (was one per job)", flush=True)
    shown = dict(Job.objects.filter(phase=Phase.PENDING).values_list("reason").annotate(n=django.db.models.Count("id"))
                 .values_list("reason", "n"))
    print(f"  waiting jobs by reason after the passes: {shown}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--per-group", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("Point DATABASE_URL at a PostgreSQL database made for this benchmark.")
    call_command("migrate", verbosity=0)
    for label, capacity in (("quota", False), ("capacity", True)):
        backend = fill(groups=args.groups, per_group=args.per_group, capacity=capacity)
        measure(f"{label} ({'1 node per group, 8 GPUs each, full' if capacity else 'no capacity check'})",
                backend, args.repeat)


if __name__ == "__main__":
    main()
