"""Benchmark: one submit of a 1,000-member array through the API, against submitting the jobs one by one.

    createdb -h 127.0.0.1 -U postgres jobsite_bench_arrays
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobsite_bench_arrays SECRET_KEY=... \
        .venv/bin/python bench/array_submit.py [--members 1000 --repeat 5 --singles 50]

The database is migrated and emptied, then holds one group, image, instance type and user with an API token.
``POST /api/v1/jobs/`` with ``"array": "0-<members-1>%8"`` is made ``--repeat`` times (in process, Django's test
client, a real commit each time): for each it prints the wall and CPU time and the queries (token, spec checks and
writes), then the median. For comparison, ``--singles`` one-job submits: their median, and that times the number
of members (what a loop of single submits would cost). Queries are SQL statements other than BEGIN, COMMIT and
the NOTIFY that wakes the scheduler after the commit. The load average is printed before and after: the figures
are only comparable on a machine otherwise idle.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_test_environment  # noqa: E402
from rest_framework.authtoken.models import Token  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402

from jobs.choices import Resource, Role  # noqa: E402
from jobs.models import Group, GroupQuota, Image, InstanceType, Job, Membership  # noqa: E402

QUERY_GOAL = 10
BODY = {"group": "bench", "image": "bench-image", "instance_type": "bench-cpu", "command": "echo $JOB_ARRAY_INDEX",
        "name": "sweep"}


def world() -> APIClient:
    call_command("migrate", verbosity=0)
    call_command("flush", "--noinput", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="bench-pass")
    group = Group.objects.create(name="bench")
    GroupQuota.objects.create(group=group, resource=Resource.GPU, quota=8, user_quota=8)
    Membership.objects.create(group=group, user=user, role=Role.MEMBER)
    image = Image.objects.create(name="bench-image", url="bench/image:latest")
    image.groups.add(group)
    it = InstanceType.objects.create(name="bench-cpu", gpu=0, cpu_millicores=500, memory_bytes=1 << 30)
    it.groups.add(group)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


CONTROL = ("BEGIN", "COMMIT", "NOTIFY")  # the transaction's bounds, and the scheduler's wake-up after the commit


def timed_post(client: APIClient, body: dict) -> tuple[float, float, int]:
    """One submit: wall ms, CPU ms (this process: the web side of the request), and its SQL statements other than
    the transaction's BEGIN / COMMIT and the wake-up's NOTIFY."""
    with CaptureQueriesContext(connection) as queries:
        wall, cpu = time.perf_counter(), time.process_time()
        response = client.post("/api/v1/jobs/", body, format="json")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert response.status_code == 201, response.content[:500]
    statements = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(CONTROL)]
    return wall * 1000, cpu * 1000, len(statements)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--singles", type=int, default=50)
    args = parser.parse_args()
    setup_test_environment()  # the test client's host name is allowed
    client = world()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    body = {**BODY, "array": f"0-{args.members - 1}%8"}
    runs = []
    for i in range(args.repeat):
        runs.append(timed_post(client, body))
        wall, cpu, queries = runs[-1]
        print(f"  array of {args.members:,} #{i + 1}: {wall:8.1f} ms ({cpu:7.1f} ms CPU) {queries:3d} queries",
              flush=True)
    assert Job.objects.count() == args.members * args.repeat
    wall = statistics.median(r[0] for r in runs)
    cpu = statistics.median(r[1] for r in runs)
    queries = max(r[2] for r in runs)
    print(f"one submit of a {args.members:,}-member array: 1 request, median {wall:.1f} ms ({cpu:.1f} ms CPU), "
          f"{queries} queries (goal: <= {QUERY_GOAL}; {queries - 1} without the token's lookup)", flush=True)
    singles = [timed_post(client, BODY) for _ in range(args.singles)]
    one = statistics.median(r[0] for r in singles)
    one_cpu = statistics.median(r[1] for r in singles)
    per_job = max(r[2] for r in singles)
    print(f"one job per request: median {one:.1f} ms ({one_cpu:.1f} ms CPU), {per_job} queries each; "
          f"{args.members:,} of them: {one * args.members / 1000:.1f} s, {per_job * args.members:,} queries, "
          f"{args.members:,} requests", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
