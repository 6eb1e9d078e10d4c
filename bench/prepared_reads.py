"""Benchmark: the hottest reads of a job's life, built and compiled by the ORM on each call against prepared once
(jobs.prepared), on the database of DATABASE_URL (the embedded default's SQLite without it).

    createdb -h 127.0.0.1 -U postgres jobsite_bench_prepared
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobsite_bench_prepared SECRET_KEY=... \
        .venv/bin/python bench/prepared_reads.py [--calls 3000]

For each read (the job a transition locks, the job a launch reads with its five related rows, an API request's token
and user, a sync round's jobs holding resources) it prints the CPU microseconds a call of this process, both ways,
over the same rows, with the queries a call makes and the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")
if "DATABASE_URL" not in os.environ:
    os.environ.setdefault("JOBSITE_VAR_DIR", tempfile.mkdtemp(prefix="jobsite-bench-prepared-"))

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from rest_framework.authtoken.models import Token  # noqa: E402

from jobs.api.auth import TOKEN_WITH_USER  # noqa: E402
from jobs.choices import RESOURCE_PHASES, Phase  # noqa: E402
from jobs.models import Attempt, Job  # noqa: E402
from jobs.services import job_spec_validate, job_submit  # noqa: E402
from jobs.services.transitions import JOB_LOCKED  # noqa: E402
from scheduler.launch import JOB_TO_LAUNCH  # noqa: E402
from scheduler.sync import HOLDING  # noqa: E402


def world(jobs: int) -> list[int]:
    """The demo world with ``jobs`` running jobs of lin's in research, each with its attempt."""
    call_command("migrate", "--noinput", verbosity=0)
    call_command("flush", "--noinput", verbosity=0)
    call_command("seed_demo", verbosity=0)
    lin = get_user_model().objects.get(username="lin")
    spec = job_spec_validate(user=lin, data={"group": "research", "image": "base-notebook", "instance_type": "gpu-1",
                                             "command": "true"})
    made = []
    for n in range(jobs):
        template = job_submit(user=lin, spec=spec)
        attempt = Attempt.objects.create(job=template, number=1, replicas=1, backend="bench")
        Job.objects.filter(pk=template.pk).update(current_attempt=attempt, phase=Phase.RUNNING, status="Running",
                                                  name=f"bench-{n}")
        made.append(template.pk)
    return made


def measure(call, calls: int) -> tuple[float, float]:
    """CPU microseconds a call, and the queries a call makes."""
    call()
    with CaptureQueriesContext(connection) as queries:
        call()
    began = time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - began) / calls * 1e6, len(queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    ids = world(20)
    key = Token.objects.get_or_create(user=get_user_model().objects.get(username="lin"))[0].key
    pick = iter(ids * (args.calls * 4 // len(ids) + 4)).__next__
    reads = {
        "the job a transition locks": (
            lambda: Job.objects.select_for_update(of=("self",)).select_related("current_attempt").get(pk=pick()),
            lambda: JOB_LOCKED.get(pk=pick())),
        "the job a launch reads, with 5 related": (
            lambda: Job.objects.select_related("current_attempt", "group", "user", "instance_type", "image")
            .get(pk=pick()),
            lambda: JOB_TO_LAUNCH.get(pk=pick())),
        "an API request's token, with its user": (
            lambda: Token.objects.select_related("user").get(key=key),
            lambda: TOKEN_WITH_USER.get(key=key)),
        "a sync round's holding jobs (20)": (
            lambda: list(Job.objects.filter(phase__in=RESOURCE_PHASES, current_attempt__backend="bench")
                         .select_related("current_attempt")),
            lambda: HOLDING.all(backend="bench")),
    }
    print(f"{connection.vendor}, {args.calls} calls each, load {os.getloadavg()[0]:.1f}")
    with transaction.atomic():  # the locking read needs one; the others are unaffected
        for name, (orm, prepared) in reads.items():
            (orm_us, orm_q), (prep_us, prep_q) = measure(orm, args.calls), measure(prepared, args.calls)
            print(f"  {name:40s} ORM {orm_us:7.1f} µs CPU ({orm_q} query)   prepared {prep_us:7.1f} µs CPU "
                  f"({prep_q} query)   {orm_us / prep_us:4.2f}x")
    print(f"load after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
