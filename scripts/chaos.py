"""Chaos suite: the production topology on this machine, hundreds of short jobs, kill -9 of its processes.

    .venv/bin/python scripts/chaos.py                      # 300 jobs, 20 kills, seed 1, default timeouts (make chaos)
    .venv/bin/python scripts/chaos.py --seed 7 --jobs 40 --kills 3 --fast

It starts PostgreSQL + Redis (scripts/ensure-services.sh), a fresh database (``--database``, emptied), and the
processes of `make prod` one by one, each in its own process group: the web (uvicorn), the scheduler
(``manage.py runscheduler``, and a second one on standby as deploy/ runs two, unless ``--no-standby``) and a
Celery worker with beat, on the local backend with ``--gpus`` fake GPUs. It submits ``--jobs`` short jobs of mixed
sizes through the API (1, 2 or 4 GPUs, one or two replicas, 0.1–2 s; some fail and are retried within their
backoff_limit, some fail on their first attempt only, some are cancelled while they run), each with an
Idempotency-Key so a submit retried after a lost answer makes no duplicate. Meanwhile it kill -9s the process group
of the scheduler (the one leading), the worker or the web ``--kills`` times at random moments and restarts it after
a random pause; everything random comes from ``--seed`` (printed) (chaos_plan.py, chaos_topology.py). A sampler
reads, every half second, what the database says is held and queued and the job processes alive on this machine
(chaos_sampler.py, where each figure it derives is defined).

The product runs at its default timeouts (start timeout 60 s, node-lost grace 300 s, termination grace 10 s, leader
retry 2 s): what a kill costs is what a user would pay. ``--fast`` shortens those bounds (10 s, 15 s, 3 s, 1 s), as
CI's short form does: a run then takes minutes at worst, but a slow recovery path looks faster than it is.

At the end it waits (``--deadline`` seconds) for every job to end and prints, each of which must be 0:
  lost              jobs submitted but not in the database, or still queued at the deadline
  stuck             jobs still holding resources (PREPARING, RUNNING, TERMINATING, UNKNOWN) at the deadline
  double attempts   jobs with two attempts at once (one launched before the previous one ended, or processes of
                    two attempts alive together)
  orphan processes  job processes still alive once every job has ended
  overcommit        samples where a node's held GPUs exceed its GPUs, a GPU id is held twice, or processes of two
                    attempts ran with the same GPU
  trail holes       ended jobs whose events lack what their path requires (Submitted, an Admitted per attempt, a
                    Started per attempt that ran and none for one that never did, Completed for a success, the
                    cancel and its Terminated; chaos_report.py)
  HTTP 5xx answers  answers of the web that were server errors (a dropped database connection, a saved submit)
  failed rounds     scheduler rounds that failed (one whose connection the database ended runs again at once)
``--db-kills`` times (4) PostgreSQL ends every connection of the topology to its database, as a restart does.
It exits 1 if any is not. Beside them, what the kills cost, each with issue 21's goal (printed, not checked): the
GPU-seconds held by attempts with nothing running (in all, per kill, the worst attempts), the longest queue stall,
the run's wall time (first submit to every job ended; compare a run with ``--kills 0``), and the machine's load at
the start and the end. The logs of the processes are kept in the printed directory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
from chaos_plan import SUBMITTERS, PlannedJob, plan
from chaos_report import load, overlapping_attempts, print_recovery, print_zeros, trail_holes
from chaos_sampler import INTERVAL, QUEUED_PHASES, RESOURCE_PHASES, TERMINAL_PHASES, Sampler, replica_processes
from chaos_topology import ROOT, VENV, Topology, free_port, request, until_answered

PG = "postgres://postgres@127.0.0.1:5432"
PASSWORD = "chaos-pass-4417"
# --fast: the recovery bounds shortened so that a run takes minutes, not hours; the rules are the same. Without it
# these are left unset (any value inherited is dropped): the product's defaults.
FAST = {"JOBSITE_LOCAL_START_TIMEOUT_SECONDS": "10", "JOBSITE_NODE_LOST_GRACE_SECONDS": "15",
        "JOBSITE_TERMINATION_GRACE_SECONDS": "3", "JOBSITE_LEADER_RETRY_SECONDS": "1"}
START_ALLOWANCE = 2.0  # seconds after its launch before an attempt with nothing running counts as holding idle GPUs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--db-kills", type=int, default=4, help="times PostgreSQL ends every connection of the "
                        "topology to its database (pg_terminate_backend) at random moments (default 4)")
    parser.add_argument("--fast", action="store_true", help="shortened recovery timeouts (CI's short form); "
                                                            "default: the product's own")
    parser.add_argument("--window", type=float, help="seconds over which the kills are spread (default: 0.5 s a job)")
    parser.add_argument("--deadline", type=float, default=1200, help="seconds for every job to end after the last "
                                                                      "kill")
    parser.add_argument("--database", default="jobsite_chaos", help="PostgreSQL database (dropped and created)")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/3")
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs of the local node")
    parser.add_argument("--no-standby", dest="standby", action="store_false",
                        help="one scheduler process (default: a second one on standby, as deploy/ runs two replicas)")
    parser.add_argument("--var", help="directory for the logs and the jobs' files (default: a new temporary one)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped from outside: the topology is stopped too

    load_at_start = load()
    rng = random.Random(args.seed)
    window = args.window or max(20.0, 0.5 * args.jobs)
    jobs, kills = plan(rng, args.jobs, args.kills, window)
    db_kills = sorted(round(rng.uniform(2, window), 2) for _ in range(args.db_kills))
    var = Path(args.var or tempfile.mkdtemp(prefix="jobsite-chaos-")).resolve()
    var.mkdir(parents=True, exist_ok=True)
    kinds = Counter(j.kind for j in jobs)
    timeouts = ("fast timeouts (" + ", ".join(f"{k}={v}" for k, v in FAST.items()) + ")" if args.fast
                else "the product's default timeouts")
    print(f"chaos: seed {args.seed}, {args.jobs} jobs ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), "
          f"{len(kills)} kills ({', '.join(f'{n} {v}' for v, n in sorted(Counter(k.victim for k in kills).items()))}) "
          f"and {len(db_kills)} of the database's connections "
          f"over {window:.0f} s, {timeouts}; load {load_at_start} (1 / 5 / 15 min, {os.cpu_count()} CPUs); logs in "
          f"{var}", flush=True)

    subprocess.run([str(ROOT / "scripts" / "ensure-services.sh"), "--no-browser"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PG_DB": args.database})
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{args.database}"')
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE" and k not in FAST}
    env.update(
        DATABASE_URL=f"{PG}/{args.database}", REDIS_URL=args.redis, SECRET_KEY=secrets.token_urlsafe(50),
        DEMO_PASSWORD=PASSWORD, JOBSITE_BACKEND="local", JOBSITE_SCHEDULER_MODE="process",
        JOBSITE_SCHEDULER_HTTP_PORT=str(free_port()), JOBSITE_VAR_DIR=str(var / "var"),
        JOBSITE_LOCAL_USE_NVIDIA_SMI="false", JOBSITE_LOCAL_GPUS=str(args.gpus),
    )
    if args.fast:
        env.update(FAST)
    (var / "var").mkdir(exist_ok=True)
    for step in (["migrate", "--noinput"], ["seed_demo"]):
        subprocess.run([str(VENV / "python"), "manage.py", *step], cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL)
    root_id = hashlib.sha256(os.fsencode((var / "var" / "local").resolve())).hexdigest()[:16]

    topology = Topology(env, var, port)
    for name in ("web", "scheduler", "worker") + (("scheduler-2",) if args.standby else ()):
        topology.start(name)
    conn = psycopg.connect(f"{PG}/{args.database}", autocommit=True)
    errors: list[str] = []
    try:
        start_deadline = time.monotonic() + 180
        status, body = until_answered(start_deadline, lambda: request(topology.base, "GET", "/login/"), "the web")
        tokens = {}
        for user in {u for u, _ in SUBMITTERS}:
            status, body = until_answered(start_deadline, lambda user=user: request(
                topology.base, "POST", "/api/v1/auth/token/", {"username": user, "password": PASSWORD}), "login")
            tokens[user] = json.loads(body)["token"]

        t0 = time.monotonic()
        submit_deadline = t0 + window + args.deadline
        stop = threading.Event()
        server_errors: list[str] = []  # 5xx answers: a saved submit or a dropped connection must never give one
        ended_connections: list[int] = []  # per database kill, the connections PostgreSQL ended
        sampler = Sampler(psycopg.connect(f"{PG}/{args.database}", autocommit=True), root_id, args.gpus,
                          topology.killed, allowance=START_ALLOWANCE)

        def submit(job: PlannedJob) -> None:
            body = {"name": f"chaos-{job.index}-{job.kind}", "group": job.group, "image": "base-notebook",
                    "instance_type": job.instance_type, "replicas": job.replicas, "command": job.command,
                    "backoff_limit": job.backoff_limit}
            status, answer = until_answered(submit_deadline, lambda: request(
                topology.base, "POST", "/api/v1/jobs/", body, token=tokens[job.user], key=job.key), "submit",
                server_errors)
            if status not in (200, 201):
                errors.append(f"submit {job.index}: HTTP {status} {answer[:200]!r}")
                return
            job.job_id, job.submitted_at = json.loads(answer)["id"], time.monotonic()
            if job.kind == "cancel":
                time.sleep(job.cancel_after)
                status, answer = until_answered(submit_deadline, lambda: request(
                    topology.base, "POST", f"/api/v1/jobs/{job.job_id}/cancel/", token=tokens[job.user]), "cancel",
                    server_errors)
                if status not in (200, 202, 400):  # 400: it had already ended
                    errors.append(f"cancel {job.job_id}: HTTP {status} {answer[:200]!r}")

        def chaos() -> None:
            for kill in kills:
                while time.monotonic() < t0 + kill.at and not stop.is_set():
                    topology.watch()
                    time.sleep(0.1)
                killed = topology.kill(kill.victim, at=time.monotonic() - t0)
                time.sleep(kill.down)
                topology.start(killed)
            while not stop.is_set():
                topology.watch()
                time.sleep(0.5)

        def database_chaos() -> None:
            """End every connection of the topology to its database, as a restart or a failover does."""
            own = {conn.info.backend_pid, sampler.conn.info.backend_pid}
            for at in db_kills:
                while time.monotonic() < t0 + at and not stop.is_set():
                    time.sleep(0.1)
                with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
                    ended = admin.execute(
                        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = %s AND NOT pid = ANY(%s)", [args.database, sorted(own)]).fetchone()[0]
                ended_connections.append(ended)

        def sampling() -> None:
            with sampler.conn:
                while not stop.is_set():
                    try:
                        sampler.sample(time.monotonic() - t0)
                    except psycopg.Error as exc:
                        errors.append(f"sampler: {exc}")
                    time.sleep(INTERVAL)
            sampler.finish()

        threads = [threading.Thread(target=target, daemon=True) for target in (chaos, database_chaos, sampling)]
        for thread in threads:
            thread.start()
        with ThreadPoolExecutor(8) as pool:  # submitters, spread over the kill window
            for job in jobs:
                pool.submit(submit, job)
                time.sleep(window / len(jobs) / 2)
        while (any(k.at + k.down > time.monotonic() - t0 for k in kills)
               or len(ended_connections) < len(db_kills)):
            time.sleep(0.5)
        print(f"submitted {sum(1 for j in jobs if j.job_id)}/{len(jobs)} in {time.monotonic() - t0:.0f} s, kills "
              "done; waiting for every job to end", flush=True)

        ids = [j.job_id for j in jobs if j.job_id]
        end_by = time.monotonic() + args.deadline
        while time.monotonic() < end_by:
            left = conn.execute("SELECT count(*) FROM jobs_job WHERE id = ANY(%s) AND NOT phase = ANY(%s)",
                                [ids, list(TERMINAL_PHASES)]).fetchone()[0]
            if not left:
                break
            time.sleep(1)
        ended_in = time.monotonic() - t0
        # The supervisors of the last jobs exit once they have recorded their end: a moment for them to go.
        settle = time.monotonic() + 30
        while replica_processes(root_id) and time.monotonic() < settle:
            time.sleep(0.5)
        stop.set()
        for thread in threads:
            thread.join(timeout=30)

        findings = sampler.found
        phases = dict(conn.execute("SELECT id, phase FROM jobs_job WHERE id = ANY(%s)", [ids]).fetchall())
        lost = {j.index: "submit never answered" for j in jobs if not j.job_id}
        lost.update({i: f"job {i} not in the database" for i in ids if i not in phases})
        lost.update({i: p for i, p in phases.items() if p in QUEUED_PHASES})
        stuck = {i: p for i, p in phases.items() if p in RESOURCE_PHASES}
        double = {**findings.double, **overlapping_attempts(conn, ids)}
        orphans = replica_processes(root_id)
        holes = trail_holes(conn, ids)
        ends = Counter(p for p in phases.values() if p in TERMINAL_PHASES)
        print(f"ended {sum(ends.values())}/{len(jobs)} within {ended_in:.0f} s "
              f"({', '.join(f'{n} {p}' for p, n in sorted(ends.items()))}); process restarts unasked: "
              f"{dict(topology.unexpected) or 0}")
        orphaned = {o[0]: f"job {o[1]} attempt {o[2]}: {o[4][:80]}" for o in orphans}
        failed_rounds = scheduler_log_lines(var, "round failed")
        figures = [("lost", len(lost), lost), ("stuck", len(stuck), stuck), ("double attempts", len(double), double),
                   ("orphan processes", len(orphans), orphaned),
                   ("overcommit samples", len(findings.overcommit), dict(enumerate(findings.overcommit))),
                   ("trail holes", len(holes), holes),
                   ("HTTP 5xx answers", len(server_errors), dict(enumerate(server_errors))),
                   ("failed rounds", len(failed_rounds), dict(enumerate(failed_rounds)))]
        print_zeros(figures)
        print(f"  (the database ended every connection {len(ended_connections)} times: "
              f"{', '.join(map(str, ended_connections)) or 'none'} connections; scheduler rounds run again on a "
              f"fresh connection: {len(scheduler_log_lines(var, 'round lost its database connection'))})")
        print(f"  (overcommit checked in {findings.samples} samples)")
        print_recovery(findings, topology.killed, ended_in, START_ALLOWANCE)
        print(f"  load               {load_at_start} at the start, {load()} at the end (1 / 5 / 15 min, "
              f"{os.cpu_count()} CPUs)")
        for error in errors[:10]:
            print(f"  error: {error}")
        bad = [name for name, count, _ in figures if count] + (["errors"] if errors else [])
        print(f"chaos seed {args.seed}: " + ("all 0" if not bad else "NOT 0: " + ", ".join(bad)), flush=True)
        return 1 if bad else 0
    finally:
        topology.stop_all()
        conn.close()
        for pid, *_ in replica_processes(root_id):  # what a failed run leaves: counted above, not left behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def scheduler_log_lines(var: Path, text: str) -> list[str]:
    """The lines of the scheduler processes' logs that say ``text``."""
    return [line.strip() for path in sorted(var.glob("scheduler*.log"))
            for line in path.read_text(errors="replace").splitlines() if text in line]


if __name__ == "__main__":
    sys.exit(main())
