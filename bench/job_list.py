"""Benchmark: the job list at a million jobs, served by a real server (uvicorn) on PostgreSQL.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobsite_bench .venv/bin/python bench/job_list.py --jobs 1000000

Fills the database once (kept between runs; --refill to start again) with one INSERT … SELECT over
generate_series: jobs spread over 10 groups and all 50 users (5 per group), names from a few model families so a
search matches some. Then starts uvicorn on it and prints, per request, the median and p95 over --repeat
requests (HTTP on one kept-alive connection) beside the goal: every first page and search p95 ≤ 50 ms, deep pages
≤ 50 ms with the cursor. Last, the list's SQL alone as it was before keyset pages, bounded counts, the trigram index
and the DISTINCT-free phase filter, and as it is now, in the same run (on a busy machine, compare those ratios).
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
os.environ.setdefault("SECRET_KEY", "bench-job-list-" + "x" * 40)

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from jobs.api.auth import token_issue  # noqa: E402
from jobs.api.pagination import encode_cursor  # noqa: E402
from jobs.choices import TERMINAL_PHASES, Phase, Resource, Role  # noqa: E402
from jobs.models import Group, GroupQuota, Image, InstanceType, Job, Membership  # noqa: E402

GOAL_MS = 50.0
N_GROUPS, USERS_PER_GROUP = 10, 5
FAMILIES = ["resnet", "bert", "llama", "vit", "gpt", "unet", "clip", "whisper"]


def fill(n_jobs: int, n_pending: int) -> None:
    User = get_user_model()
    users = [User.objects.create_user(f"bench{i}", password="bench") for i in range(N_GROUPS * USERS_PER_GROUP)]
    image = Image.objects.create(name="bench-image", url="bench:latest")
    itype = InstanceType.objects.create(name="bench-gpu-1", gpu=1)
    groups = []
    for g in range(N_GROUPS):
        group = Group.objects.create(name=f"bench-group-{g}")
        GroupQuota.objects.create(group=group, resource=Resource.GPU, quota=8, user_quota=4)
        image.groups.add(group)
        itype.groups.add(group)
        groups.append(group)
        for u in users[g * USERS_PER_GROUP:(g + 1) * USERS_PER_GROUP]:
            Membership.objects.create(group=group, user=u, role=Role.MEMBER)
    now = timezone.now()
    # One job made through the ORM gives every column its default; the rest copy it with their own values.
    seed = Job.objects.create(name="bench-seed", group=groups[0], user=users[0], image=image, image_url=image.url,
                              instance_type=itype, gpu=1, cpu_millicores=1000, memory_bytes=1 << 30,
                              command="true", phase=Phase.SUCCEEDED, status="Succeeded", queued_at=now,
                              finished_at=now)
    ended = sorted(str(p) for p in TERMINAL_PHASES)
    ended_labels = [str(Phase(p).label) for p in ended]
    # Job i (1…n): group i mod 10; within it, user (i div 10) mod 5, so every one of the 50 users has jobs.
    # The newest: 8 running per group (its whole GPU quota), then n_pending waiting behind them; the rest ended,
    # in phase i mod 5: each group holds one ended phase only, so a member's filter on another phase matches
    # almost nothing of theirs (the case where walking the whole table newest first would cost most).
    running_from, pending_from = n_jobs - n_pending - 80, n_jobs - n_pending
    values = {
        "name": f"(ARRAY{FAMILIES!r})[1 + mod(i / 7, {len(FAMILIES)})] || '-' || i",
        "group_id": f"(ARRAY{[g.pk for g in groups]})[1 + mod(i, {N_GROUPS})]",
        "user_id": f"(ARRAY{[u.pk for u in users]})[1 + mod(i, {N_GROUPS}) * {USERS_PER_GROUP} "
                   f"+ mod(i / {N_GROUPS}, {USERS_PER_GROUP})]",
        "phase": f"CASE WHEN i > {pending_from} THEN 'PENDING' WHEN i > {running_from} THEN 'RUNNING' "
                 f"ELSE (ARRAY{ended!r})[1 + mod(i, {len(ended)})] END",
        "status": f"CASE WHEN i > {pending_from} THEN 'Pending' WHEN i > {running_from} THEN 'Running' "
                  f"ELSE (ARRAY{ended_labels!r})[1 + mod(i, {len(ended)})] END",
        "finished_at": f"CASE WHEN i > {running_from} THEN NULL ELSE %(now)s - make_interval(secs => {n_jobs} - i) END",
        "admitted_at": f"CASE WHEN i > {pending_from} THEN NULL "
                       f"ELSE %(now)s - make_interval(secs => {n_jobs} - i + 60) END",
        "queued_at": f"%(now)s - make_interval(secs => {n_jobs} - i + 120)",
        "created_at": f"%(now)s - make_interval(secs => {n_jobs} - i + 120)",
        "updated_at": f"%(now)s - make_interval(secs => {n_jobs} - i)",
    }
    columns = [f.column for f in Job._meta.concrete_fields if f.column != "id"]
    select = ", ".join(values.get(c, f"s.{connection.ops.quote_name(c)}") for c in columns)
    sql = (f"INSERT INTO jobs_job ({', '.join(connection.ops.quote_name(c) for c in columns)}) "
           f"SELECT {select} FROM jobs_job s, generate_series(1, %(n)s) AS i WHERE s.id = %(seed)s")
    t0 = time.perf_counter()
    with connection.cursor() as c:
        c.execute(sql, {"now": now, "n": n_jobs - 1, "seed": seed.pk})
    print(f"  inserted {n_jobs} jobs in {time.perf_counter() - t0:.0f} s", flush=True)
    t0 = time.perf_counter()
    with connection.cursor() as c:
        c.execute("VACUUM ANALYZE")  # what autovacuum does after a bulk load: visibility map and statistics
    print(f"  vacuum analyze in {time.perf_counter() - t0:.0f} s", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "JOBSITE_SCHEDULER_MODE": "process", "DEBUG": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "jobsite.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--no-access-log", "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("uvicorn exited:\n" + log.read_text()[-3000:])
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.2)
    proc.terminate()
    raise SystemExit("uvicorn did not listen within 120 s")


def timed(conn: http.client.HTTPConnection, path: str, headers: dict, repeat: int) -> tuple[float, float]:
    times = []
    for i in range(repeat + 2):
        t0 = time.perf_counter()
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        elapsed = (time.perf_counter() - t0) * 1000
        assert response.status == 200, (path, response.status)
        if i >= 2:  # the first two warm the server's caches and connection
            times.append(elapsed)
    times.sort()
    return statistics.median(times), times[max(0, round(len(times) * 0.95) - 1)]


def sql_timed(statements: list[str], repeat: int) -> tuple[float, float]:
    """Median and p95 of running ``statements`` one after the other (one request's queries), in ms."""
    times = []
    with connection.cursor() as cursor:
        for i in range(repeat + 1):
            t0 = time.perf_counter()
            for sql in statements:
                cursor.execute(sql)
                if cursor.description is not None:
                    cursor.fetchall()
            if i:
                times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[max(0, round(len(times) * 0.95) - 1)]


def compare_queries(repeat: int, middle: int) -> None:
    """The list's queries before this change and now, side by side in one run (the database part of a request:
    a busy machine slows both alike)."""
    cols = ", ".join(f"jobs_job.{connection.ops.quote_name(f.column)}" for f in Job._meta.concrete_fields)
    failed = "WHERE jobs_job.phase = 'FAILED'"
    search = "WHERE UPPER(jobs_job.name::text) LIKE UPPER('%whisper-99%')"
    rows = [
        ("count, all jobs",
         ["SELECT COUNT(*) FROM jobs_job"],
         ["SELECT COUNT(*) FROM (SELECT id FROM jobs_job LIMIT 10001) s",
          "SELECT reltuples::bigint FROM pg_class WHERE oid = 'jobs_job'::regclass"]),
        ("phase=FAILED: count + page",
         [f"SELECT COUNT(*) FROM (SELECT DISTINCT {cols} FROM jobs_job {failed}) s",
          f"SELECT DISTINCT {cols} FROM jobs_job {failed} ORDER BY jobs_job.id DESC LIMIT 50"],
         [f"SELECT COUNT(*) FROM (SELECT id FROM jobs_job {failed} LIMIT 10001) s",
          f"EXPLAIN (FORMAT JSON) SELECT id FROM jobs_job {failed}",
          f"SELECT {cols} FROM jobs_job {failed} ORDER BY jobs_job.id DESC LIMIT 50"]),
        ("q=whisper-99: count + page (no index / trigram)",
         ["SET enable_bitmapscan = off",
          f"SELECT COUNT(*) FROM jobs_job {search}",
          f"SELECT {cols} FROM jobs_job {search} ORDER BY jobs_job.id DESC LIMIT 50",
          "RESET enable_bitmapscan"],
         [f"SELECT COUNT(*) FROM (SELECT id FROM jobs_job {search} LIMIT 10001) s",
          f"SELECT {cols} FROM jobs_job {search} ORDER BY jobs_job.id DESC LIMIT 50"]),
        ("middle of the list, 500 rows (offset / cursor)",
         [f"SELECT {cols} FROM jobs_job ORDER BY jobs_job.id DESC LIMIT 500 OFFSET 500000"],
         [f"SELECT {cols} FROM jobs_job WHERE jobs_job.id < {middle} ORDER BY jobs_job.id DESC LIMIT 501"]),
    ]
    print(f"  the list's SQL alone, before → now (median / p95 over {repeat}, ms)")
    for label, before, now in rows:
        b_med, b_p95 = sql_timed(before, repeat)
        n_med, n_p95 = sql_timed(now, repeat)
        print(f"    {label:48s} {b_med:8.1f} {b_p95:8.1f}  →  {n_med:6.1f} {n_p95:6.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=2000, help="jobs left PENDING")
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--refill", action="store_true")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server on the way out
    if connection.vendor != "postgresql":
        raise SystemExit("Point DATABASE_URL at a PostgreSQL database made for this benchmark.")

    call_command("migrate", verbosity=0)
    if args.refill:
        Job.objects.all().delete()
        get_user_model().objects.filter(username__startswith="bench").delete()
        Group.objects.filter(name__startswith="bench-").delete()
    if not Job.objects.exists():
        print(f"filling {args.jobs} jobs ...", flush=True)
        fill(args.jobs, args.pending)
    total = Job.objects.count()
    member = get_user_model().objects.get(username="bench0")
    admin, _ = get_user_model().objects.get_or_create(username="bench-admin", defaults={"is_superuser": True})
    api_admin = {"Authorization": f"Token {token_issue(user=admin).key}"}
    api_member = {"Authorization": f"Token {token_issue(user=member).key}"}
    ui = Client()
    ui.force_login(member)
    html_member = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={ui.cookies[settings.SESSION_COOKIE_NAME].value}"}
    newest = Job.objects.order_by("-id").values_list("id", flat=True)
    job_id = newest[500]
    middle = newest[total // 2]
    deep_cursor = encode_cursor([middle], forward=True)

    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-job-list-{port}.log"
    server = start_server(port, log)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        rows = [
            ("API page 1, superuser (all jobs)", "/api/v1/jobs/", api_admin),
            ("API page 1, member of one group", "/api/v1/jobs/", api_member),
            ("API filter group", "/api/v1/jobs/?group=bench-group-3", api_admin),
            ("API filter phase=FAILED", "/api/v1/jobs/?phase=FAILED", api_admin),
            ("API filter phase=FAILED&phase=PENDING", "/api/v1/jobs/?phase=FAILED&phase=PENDING", api_admin),
            ("API filter user (bench7)", "/api/v1/jobs/?user=bench7", api_admin),
            ("API search q=whisper-99", "/api/v1/jobs/?q=whisper-99", api_admin),
            ("API search q=llama-12345 (rare)", "/api/v1/jobs/?q=llama-12345", api_admin),
            (f"API search q=#{job_id}", f"/api/v1/jobs/?q=%23{job_id}", api_admin),
            ("API cursor, middle of the list", f"/api/v1/jobs/?cursor={deep_cursor}", api_admin),
            ("API cursor, middle, 500 a page", f"/api/v1/jobs/?cursor={deep_cursor}&page_size=500", api_admin),
            ("API page 100 of 500 a page (offset)", "/api/v1/jobs/?page=100&page_size=500", api_admin),
            ("API job detail", f"/api/v1/jobs/{job_id}/", api_admin),
            ("HTML list, member of one group", "/", html_member),
            ("HTML list, member, phase=SUCCEEDED", "/?phase=SUCCEEDED", html_member),
            ("HTML list, member, q=resnet", "/?q=resnet", html_member),
        ]
        print(f"{total} jobs; uvicorn (1 process); median / p95 over {args.repeat} requests, ms; goal p95 ≤ "
              f"{GOAL_MS:.0f} ms", flush=True)
        print(f"  {'request':44s} {'median':>8s} {'p95':>8s} {'goal':>6s}")
        for label, path, headers in rows:
            med, p95 = timed(conn, path, headers, args.repeat)
            verdict = "ok" if p95 <= GOAL_MS else "MISS"
            print(f"  {label:44s} {med:8.1f} {p95:8.1f} {GOAL_MS:6.0f} {verdict}", flush=True)
        conn.close()
        compare_queries(args.repeat, middle)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    main()
