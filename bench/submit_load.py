"""Benchmark: many concurrent submitters against the production topology (uvicorn web, scheduler process, Celery).

    .venv/bin/python bench/submit_load.py                     # starts `make prod` on a fresh database, then stops it
    .venv/bin/python bench/submit_load.py --url http://127.0.0.1:8000 --password demo-pass   # a running one

``--submitters`` threads (50) each submit ``--submits`` jobs (20) as the demo users, one after another, each with
its own Idempotency-Key, within ``--time-limit`` seconds; loopback only. It prints the answers by HTTP status (and
the first error of each), the submit latency p50/p95/p99, and the peak number of PostgreSQL connections the web
process held (its established TCP connections to PostgreSQL, sampled with `ss`), next to the peak of all
connections to the database (pg_stat_activity: web, scheduler and worker together).
"""

from __future__ import annotations

import argparse
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

PG = "postgres://postgres@127.0.0.1:5432"
USERS = ["bob", "pan", "lin"]


def start_prod(db: str, password: str, pool_max: str | None) -> tuple[subprocess.Popen, str, Path]:
    """`make prod` on a fresh database, as a user starts it; returns the process, its URL and its log."""
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    port = free_port()
    var = Path(tempfile.mkdtemp(prefix="jobsite-bench-submit-"))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(PORT=str(port), JOBSITE_VAR_DIR=str(var / "var"), DEMO_PASSWORD=password,
               DATABASE_URL=f"{PG}/{db}", REDIS_URL="redis://127.0.0.1:6379/13", JOBSITE_LOCAL_USE_NVIDIA_SMI="false")
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


def listening_pid(port: int) -> int | None:
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True).stdout
    found = re.search(r"pid=(\d+)", out)
    return int(found.group(1)) if found else None


def pg_connections_of(pid: int) -> int:
    out = subprocess.run(["ss", "-Htnp", "state", "established", "dport = :5432"], capture_output=True,
                         text=True).stdout
    return sum(1 for line in out.splitlines() if f"pid={pid}," in line)


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
    parser.add_argument("--submitters", type=int, default=50)
    parser.add_argument("--submits", type=int, default=20, help="per submitter")
    parser.add_argument("--time-limit", type=float, default=300, help="seconds for all submits")
    args = parser.parse_args()

    proc = None
    if args.url:
        base = args.url.rstrip("/")
        if urllib.parse.urlsplit(base).hostname not in ("127.0.0.1", "localhost"):
            sys.exit("loopback only: --url must be on 127.0.0.1")
    else:
        proc, base, log = start_prod(args.database, args.password, args.pool_max)
        print(f"make prod on {base} (log: {log})", flush=True)
    try:
        web_pid = listening_pid(urllib.parse.urlsplit(base).port or 80)
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
                    if web_pid:
                        peak_web = max(peak_web, pg_connections_of(web_pid))
                    stop.wait(0.05)

        deadline = time.monotonic() + args.time_limit
        latencies: list[float] = []
        statuses: Counter = Counter()
        first_error: dict[str, str] = {}

        def submitter(i: int) -> None:
            token = tokens[i % len(tokens)]
            for n in range(args.submits):
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
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.submitters) as pool:
            list(pool.map(submitter, range(args.submitters)))
        elapsed = time.monotonic() - started
        stop.set()
        sampler.join(timeout=10)
    finally:
        if proc is not None:
            stop_prod(proc)

    total = args.submitters * args.submits
    print(f"{args.submitters} submitters x {args.submits} submits = {total} in {elapsed:.1f} s "
          f"({sum(statuses.values()) / elapsed:.0f}/s)")
    print("answers: " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())))
    for label, text in first_error.items():
        print(f"  first {label}: {text}")
    print(f"submit latency: p50 {pct(latencies, .5) * 1000:.0f} ms, p95 {pct(latencies, .95) * 1000:.0f} ms, "
          f"p99 {pct(latencies, .99) * 1000:.0f} ms")
    print(f"peak PostgreSQL connections: web process (pid {web_pid}) {peak_web}; "
          f"all processes on {args.database} {peak_db}")


if __name__ == "__main__":
    main()
