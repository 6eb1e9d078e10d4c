"""Benchmark: many concurrent submitters against the production topology (uvicorn web, scheduler process, Celery).

    .venv/bin/python bench/submit_load.py                     # starts `make prod` on a fresh database, then stops it
    .venv/bin/python bench/submit_load.py --url http://127.0.0.1:8000 --password demo-pass   # a running one

``--submitters`` threads (50) each submit ``--submits`` jobs (20) as the demo users, one after another, each with
its own Idempotency-Key, within ``--time-limit`` seconds; loopback only. By default each sends its next submit as
soon as the last is answered (the machine's saturation: p95 is then the submitters' number over the throughput);
``--rate R`` spaces all submits evenly at R a second (the latency at a load below it). ``--queue-stopped`` stops the
group's queue first, so nothing is launched and the submits alone are measured; ``--watchers N`` keeps N job-list
pages of a member open meanwhile (WebSocket clients), so each change is rendered and sent as well. It prints the
answers by HTTP status (and the first error of each), the submit latency p50/p95/p99 beside the goal (p95 <= 300
ms), the CPU seconds the web processes and all of the topology's processes spent (per submit too, and by kind of
process, beside the submitters' own), the whole machine's busy CPU less the submitters' (PostgreSQL's and Redis'
too), the database's statements per submit (pg_stat_statements when it is loaded, else its transactions), the
machine's load before and after, and the peak number of PostgreSQL connections the web processes held (its
established TCP connections to PostgreSQL, sampled with `ss`), next to the peak of all connections to the database
(pg_stat_activity: web, scheduler and worker together).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from chaos_topology import free_port, request  # noqa: E402  (the HTTP call the chaos run makes too)
from page_watchers import Watchers, session_cookie  # noqa: E402  (bench/)
from proc_cpu import (  # noqa: E402  (bench/)
    cpu_by_label,
    cpu_seconds,
    machine_busy_seconds,
    session_pids,
    speed_line,
)

PG = "postgres://postgres@127.0.0.1:5432"
USERS = ["bob", "pan", "lin"]
GOAL_P95_MS = 300
def db_counters(db: str) -> tuple[int, int | None]:
    """The database's committed transactions so far, and its statements (None without pg_stat_statements)."""
    with psycopg.connect(f"{PG}/{db}", autocommit=True) as conn:
        xacts = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                             [db]).fetchone()[0]
        try:
            calls = conn.execute("SELECT sum(calls) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                                 "WHERE d.datname = %s", [db]).fetchone()[0]
        except psycopg.Error:
            calls = None
    return int(xacts), None if calls is None else int(calls)


def start_prod(db: str, password: str, pool_max: str | None, redis_url: str) -> tuple[subprocess.Popen, str, Path]:
    """`make prod` on a fresh database, as a user starts it; returns the process, its URL and its log."""
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    port = free_port()
    var = Path(tempfile.mkdtemp(prefix="jobsite-bench-submit-"))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(PORT=str(port), JOBSITE_VAR_DIR=str(var / "var"), DEMO_PASSWORD=password,
               DATABASE_URL=f"{PG}/{db}", REDIS_URL=redis_url, JOBSITE_LOCAL_USE_NVIDIA_SMI="false")
    if pool_max:
        env["JOBSITE_DB_POOL_MAX"] = pool_max
    log = var / "prod.log"
    proc = subprocess.Popen(["make", "--no-print-directory", "prod"], cwd=ROOT, env=env, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            urllib.request.urlopen(base + "/login/", timeout=30)
            return proc, base, log
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    stop_prod(proc)
    sys.exit("make prod did not serve:\n" + log.read_text()[-3000:])


def stop_prod(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def listening_pids(port: int) -> list[int]:
    """The processes serving ``port``: each web worker holds the listening socket."""
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True).stdout
    return sorted({int(pid) for pid in re.findall(r"pid=(\d+)", out)})


def pg_connections_of(pids: list[int]) -> int:
    """The established TCP connections to port 5432 the processes hold: their sockets' inodes (their fds), found in
    the kernel's tables. Read here, not by ``ss -p``: a program started 20 times a second that read every process's
    fds, its CPU counted in the machine's as the topology's."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
        except OSError:  # the process has ended
            continue
    found = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:  # sl local remote state ... inode
            fields = row.split()
            found += fields[3] == "01" and fields[2].endswith(":1538") and fields[9] in inodes  # 0x1538: 5432
    return found


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running jobsite (loopback); default: start `make prod` here")
    parser.add_argument("--database", default="jobsite_bench_submit",
                        help="database of the started topology (emptied), or the one --url uses")
    parser.add_argument("--password", default="bench-pass", help="the demo users' password")
    parser.add_argument("--pool-max", help="JOBSITE_DB_POOL_MAX for the started topology")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13", help="REDIS_URL of the started topology")
    parser.add_argument("--submitters", type=int, default=50)
    parser.add_argument("--submits", type=int, default=20, help="per submitter")
    parser.add_argument("--time-limit", type=float, default=300, help="seconds for all submits")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="submits a second, all submitters together, evenly spaced (default 0: each submitter "
                             "sends its next as soon as the last is answered, the machine's saturation)")
    parser.add_argument("--queue-stopped", action="store_true",
                        help="stop the group's queue first (nothing is launched: the submits alone)")
    parser.add_argument("--watchers", type=int, default=0,
                        help="job-list pages open meanwhile (WebSocket clients logged in as a member of the group: "
                             "each change is then rendered and sent; default 0, no page open)")
    args = parser.parse_args()

    proc = None
    if args.url:
        base = args.url.rstrip("/")
        if urllib.parse.urlsplit(base).hostname not in ("127.0.0.1", "localhost"):
            sys.exit("loopback only: --url must be on 127.0.0.1")
    else:
        proc, base, log = start_prod(args.database, args.password, args.pool_max, args.redis_url)
        print(f"make prod on {base} (log: {log})", flush=True)
    try:
        web_pids = listening_pids(urllib.parse.urlsplit(base).port or 80)
        if args.queue_stopped:
            with psycopg.connect(f"{PG}/{args.database}", autocommit=True) as conn:
                conn.execute("UPDATE jobs_group SET queue_stopped = true WHERE name = 'phusers'")
        tokens = [json.loads(request(base, "POST", "/api/v1/auth/token/", {"username": u, "password": args.password},
                                     timeout=60.0)[1])["token"] for u in USERS]
        peak_web = peak_db = 0
        stop = threading.Event()

        def sample():
            nonlocal peak_web, peak_db
            with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
                while not stop.is_set():
                    peak_db = max(peak_db, conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                                        [args.database]).fetchone()[0])
                    if web_pids:
                        peak_web = max(peak_web, pg_connections_of(web_pids))
                    stop.wait(0.2)  # a pool's connections stay: its peak is held, not a moment's

        deadline = time.monotonic() + args.time_limit
        latencies: list[float] = []
        statuses: Counter = Counter()
        first_error: dict[str, str] = {}

        def submitter(i: int) -> None:
            token = tokens[i % len(tokens)]
            for n in range(args.submits):
                if args.rate:  # its turn in the even spacing; a submitter behind it sends at once
                    delay = started + (n * args.submitters + i) / args.rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                if time.monotonic() >= deadline:
                    statuses["not sent (time limit)"] += args.submits - n
                    return
                body = {"group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny",
                        "command": "true", "name": f"load-{i}-{n}"}
                t0 = time.monotonic()
                try:
                    code, raw = request(base, "POST", "/api/v1/jobs/", body, token=token, key=str(uuid.uuid4()),
                                        timeout=60.0)
                    label = str(code)
                except (urllib.error.URLError, OSError) as exc:
                    label, raw = type(exc).__name__, str(exc).encode()
                latencies.append(time.monotonic() - t0)
                statuses[label] += 1
                if label != "201":
                    first_error.setdefault(label, raw[:300].decode(errors="replace"))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        all_pids = session_pids(proc.pid) if proc is not None else web_pids
        speed = speed_line()
        load_before = os.getloadavg()
        cpu_before = (cpu_seconds(web_pids), cpu_seconds(all_pids))
        by_label_before = cpu_by_label(all_pids)
        client_before = time.process_time()
        machine_before = machine_busy_seconds()
        db_before = db_counters(args.database)
        with contextlib.ExitStack() as pages:
            if args.watchers:
                pages.enter_context(watchers := Watchers(base, session_cookie(base, USERS[0], args.password),
                                                         args.watchers))
            started = time.monotonic()
            with ThreadPoolExecutor(max_workers=args.submitters) as pool:
                list(pool.map(submitter, range(args.submitters)))
            elapsed = time.monotonic() - started
        db_after = db_counters(args.database)
        web_cpu = cpu_seconds(web_pids) - cpu_before[0]
        all_cpu = cpu_seconds(all_pids) - cpu_before[1]
        by_label = {k: v - by_label_before.get(k, 0.0) for k, v in cpu_by_label(all_pids).items()}
        client_cpu = time.process_time() - client_before
        machine = machine_busy_seconds() - machine_before - client_cpu
        load_after = os.getloadavg()
        stop.set()
        sampler.join(timeout=10)
    finally:
        if proc is not None:
            stop_prod(proc)

    total = args.submitters * args.submits
    print(f"{args.submitters} submitters x {args.submits} submits = {total} in {elapsed:.1f} s "
          f"({sum(statuses.values()) / elapsed:.0f}/s"
          + (f"; offered {args.rate:g}/s evenly spaced)" if args.rate else "; each sent when the last was answered)"))
    print("answers: " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())))
    for label, text in first_error.items():
        print(f"  first {label}: {text}")
    p95 = pct(latencies, .95) * 1000
    print(f"submit latency: p50 {pct(latencies, .5) * 1000:.0f} ms, p95 {p95:.0f} ms (goal <= {GOAL_P95_MS} ms: "
          f"{'met' if p95 <= GOAL_P95_MS else 'missed'}), p99 {pct(latencies, .99) * 1000:.0f} ms")
    sent = max(1, len(latencies))
    print(f"CPU: web processes ({len(web_pids)}) {web_cpu:.1f} s ({web_cpu / sent * 1000:.1f} ms a submit); "
          f"all of the topology's processes {all_cpu:.1f} s ({all_cpu / sent * 1000:.1f} ms a submit)")
    for name, seconds in sorted(by_label.items(), key=lambda kv: -kv[1]):
        if seconds >= 0.05:
            print(f"  {name}: {seconds:.1f} s ({seconds / sent * 1000:.1f} ms a submit)")
    print(f"the submitters themselves (this process{', and its page sockets' if args.watchers else ''}): "
          f"{client_cpu:.1f} s CPU ({client_cpu / sent * 1000:.1f} ms a submit)")
    if args.watchers:
        print(f"pages open: {args.watchers} job list(s) of {USERS[0]}, {watchers.frames} frames received")
    print(f"the machine's busy CPU (PostgreSQL and Redis too), less the submitters: {machine:.1f} s "
          f"({machine / sent * 1000:.1f} ms a submit)")
    xacts, calls = db_after[0] - db_before[0], None if db_after[1] is None else db_after[1] - db_before[1]
    print(f"database: {xacts / sent:.1f} transactions a submit (all processes)"
          + ("" if calls is None else f", {calls / sent:.1f} statements a submit (pg_stat_statements)"))
    print(f"load average (1/5/15 min): before {'/'.join(f'{x:.1f}' for x in load_before)}, after "
          f"{'/'.join(f'{x:.1f}' for x in load_after)}, on {os.cpu_count()} CPUs")
    print(f"{speed} (before the submits)")
    print(f"peak PostgreSQL connections: web processes ({len(web_pids)}) {peak_web}; "
          f"all processes on {args.database} {peak_db}")


if __name__ == "__main__":
    main()
