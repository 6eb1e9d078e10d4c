"""Benchmark: what GPU telemetry costs the database per GPU-day (issue 24: "a few KB per GPU-day" kept for the job's
life, and a write per sampling round that stays small).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobsite_bench_gpu .venv/bin/python bench/gpu_telemetry.py --days 1.2

One running attempt with ``--gpus`` GPUs is fed a sampling round every 10 s of simulated time for ``--days`` days
through the real service (``jobs.services.telemetry.gpu_points_record``), as the leader's telemetry step does.
Printed: bytes sent in the INSERT/UPDATE statements of ``jobs_gpuseries`` (the payload each round writes; the
database writes at least that, plus row headers, indexes and WAL), per GPU-day and per round; the rows and bytes
stored at the end (``pg_column_size`` of each row) split into the long-term tier (10 min points) and the rest; the
queries per round; reading the chart's timelines back; what an ended attempt keeps once its rows are folded
(``gpu_series_compact``); CPU seconds and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from jobs.choices import Phase  # noqa: E402
from jobs.models import Attempt, GpuSeries, Group, Image, InstanceType, Job  # noqa: E402
from jobs.services.telemetry import gpu_points_record  # noqa: E402

try:
    from jobs.services.telemetry import gpu_series_compact as compact  # noqa: E402
except ImportError:  # before the rows were bucketed (the "before" figures)
    compact = None
from jobs.telemetry_selectors import gpu_timelines  # noqa: E402

GIB = 1 << 30
GOAL_LONG_TERM_KB_PER_GPU_DAY = 8.0  # "a few KB per GPU-day" for the 10 min tier kept for the job's life


def size(param) -> int:
    """Bytes of one statement parameter as sent: a JSON value (psycopg's Jsonb wrapper) as its JSON text."""
    if hasattr(param, "obj"):
        return len(json.dumps(param.obj))
    return len(str(param).encode())


class Meter:
    """Counts the statements and the bytes of the parameters sent in writes to the series table."""

    def __init__(self) -> None:
        self.queries = 0
        self.write_bytes = 0
        self.writes = 0

    def __call__(self, execute, sql, params, many, context):
        self.queries += 1
        head = sql.lstrip()[:40].upper()
        if "JOBS_GPUSERIES" in sql.upper() and head.startswith(("INSERT", "UPDATE")):
            self.writes += 1
            rows = params if many else [params]
            self.write_bytes += sum(size(p) for row in rows for p in (row or ()))
        return execute(sql, params, many, context)


def fill(gpus: int) -> Attempt:
    call_command("flush", "--noinput", verbosity=0)
    user = get_user_model().objects.create_user("bench")
    image = Image.objects.create(name="bench", url="busybox")
    itype = InstanceType.objects.create(name=f"gpu-{gpus}", gpu=gpus)
    group = Group.objects.create(name="bench")
    job = Job.objects.create(name="train", group=group, user=user, instance_type=itype, gpu=gpus, image=image,
                             image_url=image.url, command="train", status="Running", phase=Phase.RUNNING,
                             queued_at=timezone.now())
    attempt = Attempt.objects.create(job=job, number=1, replicas=1, gpu=gpus, backend="local", node="n1",
                                     placement={"0": {"node": "n1", "gpu_ids": list(range(gpus))}})
    Job.objects.filter(pk=job.pk).update(current_attempt=attempt)
    return attempt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=float, default=1.2)
    parser.add_argument("--gpus", type=int, default=1)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    attempt = fill(args.gpus)
    rounds = int(args.days * 86400 / 10)
    t0 = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp())
    print(f"load before: {os.getloadavg()}")
    meter = Meter()
    cpu, wall = time.process_time(), time.perf_counter()
    with connection.execute_wrapper(meter):
        for i in range(rounds):
            epoch = t0 + 10 * i
            sm = float((i * 7) % 100)
            readings = [(0, "n1", str(g), [epoch, sm, 20 * GIB + i % 1000 * 1024, 80 * GIB, 250.0 + g, 60.0])
                        for g in range(args.gpus)]
            gpu_points_record(attempt=attempt, readings=readings, interval=10)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    gpu_days = args.days * args.gpus
    print(f"{rounds} rounds × {args.gpus} GPU(s) over {args.days:g} days: {wall:.1f} s wall, {cpu:.1f} s CPU "
          f"({cpu / rounds * 1000:.2f} ms CPU a round), {meter.queries / rounds:.2f} queries a round")
    print(f"written (statement payload): {meter.write_bytes / gpu_days / 1e6:.2f} MB per GPU-day, "
          f"{meter.write_bytes / rounds:.0f} B a round in {meter.writes / rounds:.2f} writes")
    with connection.cursor() as cursor:
        cursor.execute("SELECT resolution, count(*), sum(pg_column_size(s.*)) FROM jobs_gpuseries s "
                       "WHERE attempt_id = %s GROUP BY resolution ORDER BY resolution", [attempt.pk])
        stored = cursor.fetchall()
    for resolution, count, size in stored:
        print(f"stored @{resolution:>3} s: {count:>4} rows, {size / 1024:8.1f} KB")
    long_term = sum(size for res, _, size in stored if res == 600)
    long_days = max(args.days - 1.0, 1e-9) * args.gpus  # the 10 min tier holds what is older than a day
    json_600 = sum(len(json.dumps(s.points)) for s in GpuSeries.objects.filter(attempt=attempt, resolution=600))
    print(f"long-term (10 min) tier: {long_term / 1024 / long_days:.1f} KB per GPU-day stored, "
          f"{json_600 / 1024 / long_days:.1f} KB as JSON (goal: a few, ≤ {GOAL_LONG_TERM_KB_PER_GPU_DAY:g})")
    meter = Meter()
    cpu = time.process_time()
    with connection.execute_wrapper(meter):
        timelines = gpu_timelines(attempt)
    print(f"reading the chart back: {sum(len(t.points) for t in timelines)} points, {meter.queries} queries, "
          f"{(time.process_time() - cpu) * 1000:.1f} ms CPU")
    first = timelines[0].points
    print(f"timeline spans {timedelta(seconds=first[-1][0] - first[0][0])}, {len(first)} points on GPU 0")
    if compact is not None:  # the attempt ends; a day later its passed rows are folded as for its life
        compact(now=t0 + 10 * rounds + 2 * 86400)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*), sum(pg_column_size(s.*)) FROM jobs_gpuseries s WHERE attempt_id = %s",
                           [attempt.pk])
            count, size = cursor.fetchone()
        print(f"ended and folded: {count} rows, {size / 1024:.1f} KB in all, {size / 1024 / gpu_days:.1f} KB per "
              f"GPU-day kept for the job's life")
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
