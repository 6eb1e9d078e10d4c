"""Chaos suite: the production topology on this machine, hundreds of short jobs, kill -9 of its processes.

    .venv/bin/python scripts/chaos.py                      # 300 jobs, 20 kills, seed 1 (make chaos)
    .venv/bin/python scripts/chaos.py --seed 7 --jobs 40 --kills 3

It starts PostgreSQL + Redis (scripts/ensure-services.sh), a fresh database (``--database``, emptied), and the
processes of `make prod` one by one, each in its own process group: the web (uvicorn), the scheduler
(``manage.py runscheduler``) and a Celery worker with beat, on the local backend with ``--gpus`` fake GPUs. It submits
``--jobs`` short jobs of mixed sizes through the API (1, 2 or 4 GPUs, one or two replicas, 0.1–2 s; some fail and are
retried within their backoff_limit, some fail on their first attempt only, some are cancelled while they run),
each with an Idempotency-Key so a submit retried after a lost answer makes no duplicate. Meanwhile it kill -9s the
process group of the scheduler, the worker or the web ``--kills`` times at random moments and restarts it after a
random pause; everything random comes from ``--seed`` (printed). A sampler reads, every half second, the GPUs the
database says are held (per node and per GPU id) and the job processes alive on this machine (their
JOBSITE_REPLICA marker, read from /proc).

At the end it waits (``--deadline`` seconds) for every job to end and prints, each of which must be 0:
  lost              jobs submitted but not in the database, or still queued at the deadline
  stuck             jobs still holding resources (PREPARING, RUNNING, TERMINATING, UNKNOWN) at the deadline
  double attempts   jobs with two attempts at once (one launched before the previous one ended, or processes of
                    two attempts alive together)
  orphan processes  job processes still alive once every job has ended
  overcommit        samples where a node's held GPUs exceed its GPUs, a GPU id is held twice, or processes of two
                    attempts ran with the same GPU
  trail holes       ended jobs whose events lack what their path requires (Submitted, an Admitted per attempt, a
                    Started per attempt that ran, Completed for a success, the cancel and its Terminated)
and exits 1 if any is not. The logs of the processes are kept in the printed directory.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv" / "bin"
PG = "postgres://postgres@127.0.0.1:5432"
PASSWORD = "chaos-pass-4417"
RESOURCE_PHASES = ("PREPARING", "RUNNING", "TERMINATING", "UNKNOWN")
QUEUED_PHASES = ("SUBMITTED", "PENDING", "BACKOFF", "INADMISSIBLE")
TERMINAL_PHASES = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT", "PREEMPTED")
# (user, group): bob and pan in phusers (4 GPUs), lin in phusers and research (8 GPUs, 4 per user).
SUBMITTERS = [("bob", "phusers"), ("pan", "phusers"), ("lin", "phusers"), ("lin", "research")]
# instance type, replicas: 1, 2 or 4 GPUs per replica, within every quota.
SIZES = [("gpu-1", 1), ("gpu-1", 2), ("gpu-2", 1), ("gpu-2", 2), ("gpu-4", 1)]
MARKER = "JOBSITE_REPLICA"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the plan: everything random, from the seed ------------------------------------------------------------------


@dataclass
class PlannedJob:
    index: int
    user: str
    group: str
    instance_type: str
    replicas: int
    command: str
    backoff_limit: int
    kind: str  # ok, fail, flaky, cancel
    cancel_after: float = 0.0
    key: str = ""
    job_id: int | None = None
    submitted_at: float = 0.0


@dataclass
class Kill:
    at: float  # seconds after the first submit
    victim: str
    down: float  # seconds before it is started again


def plan(rng: random.Random, jobs: int, kills: int, window: float) -> tuple[list[PlannedJob], list[Kill]]:
    planned = []
    for i in range(jobs):
        user, group = rng.choice(SUBMITTERS)
        instance_type, replicas = rng.choice(SIZES)
        seconds = round(rng.uniform(0.1, 2.0), 2)
        kind = rng.choices(["ok", "fail", "flaky", "cancel"], weights=[60, 15, 15, 10])[0]
        command, backoff, cancel_after = f"sleep {seconds}", 0, 0.0
        if kind == "fail":  # fails every attempt: retried backoff_limit times, then FAILED
            command, backoff = f"sleep {seconds}; exit 3", rng.choice([0, 1, 2])
        elif kind == "flaky":  # fails its first attempt only
            command, backoff = f'sleep {seconds}; [ "$JOB_ATTEMPT" -ge 2 ] || exit 3', 2
        elif kind == "cancel":  # long enough to be cancelled while it runs, often
            command, cancel_after = f"sleep {seconds + 4}", round(rng.uniform(0.2, 6.0), 2)
        planned.append(PlannedJob(i, user, group, instance_type, replicas, command, backoff, kind, cancel_after,
                                  key=str(uuid.UUID(int=rng.getrandbits(128)))))
    victims = ["scheduler", "worker", "web"]
    plan_kills = sorted((Kill(round(rng.uniform(2, window), 2), rng.choice(victims), round(rng.uniform(0.3, 3), 2))
                         for _ in range(kills)), key=lambda k: k.at)
    return planned, plan_kills


# --- the topology ---------------------------------------------------------------------------------------------------


class Topology:
    """The processes of `make prod`, each in its own process group, so one can be killed and started again."""

    def __init__(self, env: dict[str, str], var: Path, port: int):
        self.env, self.var, self.port = env, var, port
        self.base = f"http://127.0.0.1:{port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.down: set[str] = set()  # killed on purpose, not started again yet
        self.unexpected: Counter[str] = Counter()
        self.lock = threading.Lock()

    def argv(self, name: str) -> list[str]:
        return {
            "web": [str(VENV / "uvicorn"), "jobsite.asgi:application", "--host", "127.0.0.1", "--port",
                    str(self.port), "--no-access-log"],
            "scheduler": [str(VENV / "python"), "manage.py", "runscheduler"],
            "worker": [str(VENV / "celery"), "-A", "jobsite", "worker", "--beat", "--loglevel", "INFO",
                       "--concurrency", "2", "--without-gossip", "--without-mingle", "--schedule",
                       str(self.var / "celerybeat-schedule")],
        }[name]

    def start(self, name: str) -> None:
        with self.lock:
            log = open(self.var / f"{name}.log", "ab")
            self.procs[name] = subprocess.Popen(self.argv(name), cwd=ROOT, env=self.env, stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)
            log.close()
            self.down.discard(name)

    def kill(self, name: str) -> None:
        with self.lock:
            self.down.add(name)
            proc = self.procs[name]
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()

    def watch(self) -> None:
        """Start again what died without being killed on purpose (counted: a process must not die by itself)."""
        for name, proc in list(self.procs.items()):
            if name not in self.down and proc.poll() is not None:
                self.unexpected[name] += 1
                self.start(name)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def request(base: str, method: str, path: str, body=None, token=None, key=None, timeout=30.0):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    if key:
        headers["Idempotency-Key"] = key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def until_answered(stop_at: float, fn, what: str):
    """Call ``fn`` until it answers (the web may be down or restarting): a connection error or a 5xx is retried."""
    last = None
    while time.monotonic() < stop_at:
        try:
            status, body = fn()
            if status < 500:
                return status, body
            last = f"HTTP {status}: {body[:200]!r}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.3)
    raise RuntimeError(f"{what}: no answer before the deadline ({last})")


# --- what is held: the database and /proc ----------------------------------------------------------------------------


def replica_processes(root_id: str) -> list[tuple[int, int, int, str, str]]:
    """(pid, job, attempt, CUDA_VISIBLE_DEVICES, cmdline) of every live process carrying this installation's marker."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        marker = env.get(MARKER.encode(), b"").decode()
        parts = marker.split(":")
        if len(parts) != 4 or parts[0] != root_id:
            continue
        found.append((int(entry), int(parts[1]), int(parts[2]), env.get(b"CUDA_VISIBLE_DEVICES", b"").decode(),
                      cmdline))
    return found


@dataclass
class Findings:
    samples: int = 0
    overcommit: list[str] = field(default_factory=list)
    double: dict[int, str] = field(default_factory=dict)


def sample(conn, root_id: str, gpus: int, found: Findings) -> None:
    found.samples += 1
    rows = conn.execute(
        "SELECT j.id, a.placement FROM jobs_job j JOIN jobs_attempt a ON a.id = j.current_attempt_id "
        "WHERE j.phase = ANY(%s)", [list(RESOURCE_PHASES)]).fetchall()
    per_node: Counter[str] = Counter()
    holders: dict[tuple[str, int], list[int]] = defaultdict(list)
    for job_id, placement in rows:
        for replica in (placement or {}).values():
            node = replica.get("node", "")
            for gpu in replica.get("gpu_ids", []):
                per_node[node] += 1
                holders[node, gpu].append(job_id)
    for node, held in per_node.items():
        if held > gpus:
            found.overcommit.append(f"node {node}: {held} GPUs held of {gpus}")
    for (node, gpu), jobs in holders.items():
        if len(set(jobs)) > 1:
            found.overcommit.append(f"GPU {gpu} of {node} held by jobs {sorted(set(jobs))}")
    # The processes: two attempts of one job alive together; a GPU used by processes of two attempts (supervisors
    # excepted: they use no GPU and outlive their command by a moment to record its exit).
    attempts_of: dict[int, set[int]] = defaultdict(set)
    users_of_gpu: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for _pid, job, attempt, visible, cmdline in replica_processes(root_id):
        attempts_of[job].add(attempt)
        if "local_runner" in cmdline:
            continue
        for gpu in filter(None, visible.split(",")):
            users_of_gpu[gpu].add((job, attempt))
    for job, attempts in attempts_of.items():
        if len(attempts) > 1:
            found.double.setdefault(job, f"processes of attempts {sorted(attempts)} alive together")
    for gpu, users in users_of_gpu.items():
        if len(users) > 1:
            found.overcommit.append(f"GPU {gpu} used by processes of (job, attempt) {sorted(users)}")


def trail_holes(conn, job_ids: list[int]) -> dict[int, str]:
    """Ended jobs whose events lack what their path requires."""
    holes: dict[int, str] = {}
    phases = dict(conn.execute("SELECT id, phase FROM jobs_job WHERE id = ANY(%s)", [job_ids]).fetchall())
    reasons: dict[int, list[str]] = defaultdict(list)
    of_attempt: dict[int | None, Counter[str]] = defaultdict(Counter)
    for job_id, attempt_id, reason in conn.execute(
            "SELECT job_id, attempt_id, reason FROM jobs_jobevent WHERE job_id = ANY(%s) ORDER BY id", [job_ids]):
        reasons[job_id].append(reason)
        of_attempt[attempt_id][reason] += 1
    attempts: dict[int, list[tuple]] = defaultdict(list)
    for row in conn.execute("SELECT job_id, id, number, launched_at, running_at, outcome FROM jobs_attempt "
                            "WHERE job_id = ANY(%s) ORDER BY number", [job_ids]):
        attempts[row[0]].append(row[1:])
    for job_id, phase in phases.items():
        if phase not in TERMINAL_PHASES:
            continue
        missing = []
        if "Submitted" not in reasons[job_id]:
            missing.append("Submitted")
        for attempt_id, number, launched_at, running_at, outcome in attempts[job_id]:
            events = of_attempt[attempt_id]
            if not events["Admitted"]:
                missing.append(f"Admitted of attempt {number}")
            if (running_at is not None or outcome in ("Completed", "Error")) and not events["Started"]:
                missing.append(f"Started of attempt {number}")
            if events["Started"] > 1:
                missing.append(f"a single Started of attempt {number} ({events['Started']})")
            if outcome == "CancelledByUser" and launched_at is not None and not events["Terminated"]:
                missing.append(f"Terminated of attempt {number} (cancelled while it held resources)")
        if phase == "SUCCEEDED" and "Completed" not in reasons[job_id]:
            missing.append("Completed")
        if phase == "CANCELLED" and "CancelledByUser" not in reasons[job_id]:
            missing.append("CancelledByUser")
        if missing:
            holes[job_id] = f"{phase}, lacks " + ", ".join(missing)
    return holes


def overlapping_attempts(conn, job_ids: list[int]) -> dict[int, str]:
    """Jobs with an attempt launched before the previous one had ended."""
    found = {}
    by_job: dict[int, list[tuple]] = defaultdict(list)
    for job_id, number, launched, ended in conn.execute(
            "SELECT job_id, number, launched_at, ended_at FROM jobs_attempt WHERE job_id = ANY(%s) ORDER BY number",
            [job_ids]):
        by_job[job_id].append((number, launched, ended))
    for job_id, rows in by_job.items():
        for (n1, _l1, e1), (n2, l2, _e2) in zip(rows, rows[1:], strict=False):
            if l2 is not None and (e1 is None or l2 < e1):
                found[job_id] = f"attempt {n2} launched before attempt {n1} ended"
    return found


# --- the run ---------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--window", type=float, help="seconds over which the kills are spread (default: 0.5 s a job)")
    parser.add_argument("--deadline", type=float, default=1200, help="seconds for every job to end after the last "
                                                                      "kill")
    parser.add_argument("--database", default="jobsite_chaos", help="PostgreSQL database (dropped and created)")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/3")
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs of the local node")
    parser.add_argument("--var", help="directory for the logs and the jobs' files (default: a new temporary one)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped from outside: the topology is stopped too

    rng = random.Random(args.seed)
    window = args.window or max(20.0, 0.5 * args.jobs)
    jobs, kills = plan(rng, args.jobs, args.kills, window)
    var = Path(args.var or tempfile.mkdtemp(prefix="jobsite-chaos-")).resolve()
    var.mkdir(parents=True, exist_ok=True)
    kinds = Counter(j.kind for j in jobs)
    print(f"chaos: seed {args.seed}, {args.jobs} jobs ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), "
          f"{len(kills)} kills ({', '.join(f'{n} {v}' for v, n in sorted(Counter(k.victim for k in kills).items()))}) "
          f"over {window:.0f} s; logs in {var}", flush=True)

    subprocess.run([str(ROOT / "scripts" / "ensure-services.sh"), "--no-browser"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PG_DB": args.database})
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{args.database}"')
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env.update(
        DATABASE_URL=f"{PG}/{args.database}", REDIS_URL=args.redis, SECRET_KEY=secrets.token_urlsafe(50),
        DEMO_PASSWORD=PASSWORD, JOBSITE_BACKEND="local", JOBSITE_SCHEDULER_MODE="process",
        JOBSITE_SCHEDULER_HTTP_PORT=str(free_port()), JOBSITE_VAR_DIR=str(var / "var"),
        JOBSITE_LOCAL_USE_NVIDIA_SMI="false", JOBSITE_LOCAL_GPUS=str(args.gpus),
        # Recovery bounds shortened so that a run takes minutes, not hours; the rules are the same.
        JOBSITE_LOCAL_START_TIMEOUT_SECONDS="10", JOBSITE_NODE_LOST_GRACE_SECONDS="15",
        JOBSITE_TERMINATION_GRACE_SECONDS="3", JOBSITE_LEADER_RETRY_SECONDS="1",
    )
    (var / "var").mkdir(exist_ok=True)
    for step in (["migrate", "--noinput"], ["seed_demo"]):
        subprocess.run([str(VENV / "python"), "manage.py", *step], cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL)
    root_id = hashlib.sha256(os.fsencode((var / "var" / "local").resolve())).hexdigest()[:16]

    topology = Topology(env, var, port)
    for name in ("web", "scheduler", "worker"):
        topology.start(name)
    conn = psycopg.connect(f"{PG}/{args.database}", autocommit=True)
    findings = Findings()
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

        def submit(job: PlannedJob) -> None:
            body = {"name": f"chaos-{job.index}-{job.kind}", "group": job.group, "image": "base-notebook",
                    "instance_type": job.instance_type, "replicas": job.replicas, "command": job.command,
                    "backoff_limit": job.backoff_limit}
            status, answer = until_answered(submit_deadline, lambda: request(
                topology.base, "POST", "/api/v1/jobs/", body, token=tokens[job.user], key=job.key), "submit")
            if status not in (200, 201):
                errors.append(f"submit {job.index}: HTTP {status} {answer[:200]!r}")
                return
            job.job_id, job.submitted_at = json.loads(answer)["id"], time.monotonic()
            if job.kind == "cancel":
                time.sleep(job.cancel_after)
                status, answer = until_answered(submit_deadline, lambda: request(
                    topology.base, "POST", f"/api/v1/jobs/{job.job_id}/cancel/", token=tokens[job.user]), "cancel")
                if status not in (200, 202, 400):  # 400: it had already ended
                    errors.append(f"cancel {job.job_id}: HTTP {status} {answer[:200]!r}")

        def chaos() -> None:
            for kill in kills:
                while time.monotonic() < t0 + kill.at and not stop.is_set():
                    topology.watch()
                    time.sleep(0.1)
                topology.kill(kill.victim)
                time.sleep(kill.down)
                topology.start(kill.victim)
            while not stop.is_set():
                topology.watch()
                time.sleep(0.5)

        def sampler() -> None:
            with psycopg.connect(f"{PG}/{args.database}", autocommit=True) as own:
                while not stop.is_set():
                    try:
                        sample(own, root_id, args.gpus, findings)
                    except psycopg.Error as exc:
                        errors.append(f"sampler: {exc}")
                    time.sleep(0.5)

        threads = [threading.Thread(target=chaos, daemon=True), threading.Thread(target=sampler, daemon=True)]
        for thread in threads:
            thread.start()
        with ThreadPoolExecutor(8) as pool:  # submitters, spread over the kill window
            for job in jobs:
                pool.submit(submit, job)
                time.sleep(window / len(jobs) / 2)
        while any(k.at + k.down > time.monotonic() - t0 for k in kills):
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
        figures = [("lost", len(lost), lost), ("stuck", len(stuck), stuck), ("double attempts", len(double), double),
                   ("orphan processes", len(orphans), orphaned),
                   ("overcommit samples", len(findings.overcommit), dict(enumerate(findings.overcommit))),
                   ("trail holes", len(holes), holes)]
        for name, count, detail in figures:
            shown = "; ".join(f"{k}: {v}" for k, v in list(detail.items())[:5])
            print(f"  {name:<20} {count:>4}" + (f"   e.g. {shown}" if count else ""))
        print(f"  (overcommit checked in {findings.samples} samples)")
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


if __name__ == "__main__":
    sys.exit(main())
