"""Benchmark: the job list and a scheduling pass with many jobs in PostgreSQL.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobsite_bench .venv/bin/python bench/job_list.py --jobs 1000000

Fills the database once (kept between runs; --refill to start again), then prints the median and p95 time of
the queries the dashboard makes: the first page of the list (all jobs, by group, by phase, by user, with the
total count), a deep page, a job's detail, and one scheduling pass over the pending jobs.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
os.environ.setdefault("JOBSITE_SCHEDULER_MODE", "inprocess")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from jobs.choices import TERMINAL_PHASES, Phase, Resource, Role  # noqa: E402
from jobs.models import Group, GroupQuota, Image, InstanceType, Job, Membership  # noqa: E402


def fill(n_jobs: int, n_pending: int) -> None:
    User = get_user_model()
    users = [User.objects.create_user(f"bench{i}", password="bench") for i in range(50)]
    image = Image.objects.create(name="bench-image", url="bench:latest")
    itype = InstanceType.objects.create(name="bench-gpu-1", gpu=1)
    groups = []
    for g in range(10):
        group = Group.objects.create(name=f"bench-group-{g}")
        GroupQuota.objects.create(group=group, resource=Resource.GPU, quota=8, user_quota=4)
        image.groups.add(group)
        itype.groups.add(group)
        groups.append(group)
        for u in users[g * 5:(g + 1) * 5]:
            Membership.objects.create(group=group, user=u, role=Role.MEMBER)
    ended = sorted(TERMINAL_PHASES)
    now = timezone.now()
    batch = []
    t0 = time.perf_counter()
    for i in range(n_jobs):
        g = i % 10
        user = users[g * 5 + i % 5]
        # The newest jobs: 8 running per group (its whole GPU quota), then n_pending waiting behind them.
        if i >= n_jobs - n_pending:
            phase, status = Phase.PENDING, "Pending"
        elif i >= n_jobs - n_pending - 80:
            phase, status = Phase.RUNNING, "Running"
        else:
            phase, status = random.choice(ended), "Succeeded"
        batch.append(Job(
            name=f"bench-{i}", group=groups[g], user=user, image=image, image_url=image.url, instance_type=itype,
            gpu=1, cpu_millicores=1000, memory_bytes=1 << 30, command="true", phase=phase, status=status,
            queued_at=now - timedelta(seconds=n_jobs - i), finished_at=now if phase in ended else None,
        ))
        if len(batch) == 10000:
            Job.objects.bulk_create(batch)
            batch = []
            print(f"\r  {i + 1} jobs", end="", flush=True)
    Job.objects.bulk_create(batch)
    with connection.cursor() as c:
        c.execute("VACUUM ANALYZE")  # what autovacuum does after a bulk load: visibility map and statistics
    print(f"\r  inserted {n_jobs} jobs in {time.perf_counter() - t0:.0f} s")


def timed(fn, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1 if len(times) > 1 else 0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=2000, help="jobs left PENDING for the scheduling pass")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--refill", action="store_true")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("Point DATABASE_URL at a PostgreSQL database made for this benchmark.")

    call_command("migrate", verbosity=0)
    if args.refill:
        Job.objects.all().delete()
        get_user_model().objects.filter(username__startswith="bench").delete()
        Group.objects.filter(name__startswith="bench-").delete()
    if not Job.objects.exists():
        print(f"filling {args.jobs} jobs ...")
        fill(args.jobs, args.pending)
    total = Job.objects.count()
    member = get_user_model().objects.get(username="bench0")
    admin, _ = get_user_model().objects.get_or_create(username="bench-admin", defaults={"is_superuser": True})
    api, ui = Client(), Client()
    api.force_login(admin)
    ui.force_login(member)
    job_id = Job.objects.order_by("-id").values_list("id", flat=True)[500]

    def get(client, url):
        def go():
            r = client.get(url)
            assert r.status_code == 200, (url, r.status_code)
        return go

    print(f"{total} jobs in the database; median / p95 over {args.repeat} requests, ms")
    rows = [
        ("API list, page 1 (superuser, all)", get(api, "/api/v1/jobs/?page_size=50")),
        ("API list, filter group", get(api, "/api/v1/jobs/?group=bench-group-3")),
        ("API list, filter phase=PENDING", get(api, "/api/v1/jobs/?phase=PENDING")),
        ("API list, filter user", get(api, "/api/v1/jobs/?user=bench7")),
        ("API list, page 100 of 500 per page", get(api, "/api/v1/jobs/?page=100&page_size=500")),
        ("API job detail", get(api, f"/api/v1/jobs/{job_id}/")),
        ("UI list, member of one group", get(ui, "/")),
        ("UI list, member, filter phase", get(ui, "/?phase=SUCCEEDED")),
    ]
    for label, fn in rows:
        med, p95 = timed(fn, args.repeat)
        print(f"  {label:40s} {med:8.1f} {p95:8.1f}")

    from scheduler.backends.local import LocalBackend
    from scheduler.passes import schedule_pass

    # Every group's quota is held by its running jobs: the pass re-decides every pending job and admits none.
    backend = LocalBackend(root=Path("/tmp/jobsite-bench"), gpus=1000)
    pending = Job.objects.filter(phase=Phase.PENDING).count()
    med, p95 = timed(lambda: schedule_pass(backend=backend), max(3, args.repeat // 4))
    print(f"  {'scheduling pass, ' + str(pending) + ' pending jobs':40s} {med:8.1f} {p95:8.1f}")


if __name__ == "__main__":
    main()
