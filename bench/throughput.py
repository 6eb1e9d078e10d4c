"""Benchmark: end-to-end throughput of trivial jobs, jobsite's embedded default against Slurm on this machine.

    .venv/bin/python bench/throughput.py                 # 1,000 jobs each, 1 round
    .venv/bin/python bench/throughput.py --jobs 200 --rounds 3
    .venv/bin/python bench/throughput.py --jobs 200 --no-slurm --profile   # jobsite alone, where its time went
    .venv/bin/python bench/throughput.py --jobs 300 --slurm tuned           # against tuned Slurm only
    .venv/bin/python bench/throughput.py --print-slurm-conf                 # both Slurm configurations, no run

Both sides get the same work: ``--jobs`` jobs of ``true``, each asking for one of 8 GPUs, submitted one by one
(each submit waits for its answer), and the clock stops when the last one has ended. jobsite runs as `make run`
starts it (SQLite, the in-process scheduler, the local backend with 8 GPUs and no nvidia-smi) and is submitted to
through its API with one kept-alive connection; the demo user lin may use all 8 GPUs of the group research. Slurm
(Debian's slurm-wlm: slurmctld and slurmd from a throwaway configuration, one node with 16 CPUs and 8 fake GPUs,
backfill scheduler, no accounting) gets `sbatch --gres=gpu:1 --wrap true`, in two configurations, each started
afresh for its round: Slurm's defaults (a full scheduling pass every 60 s, finished jobs kept 300 s) and Slurm tuned
for throughput as its High Throughput Computing guide and slurm.conf(5) describe (``TUNED``: a pass every second,
backfill every second, the whole queue tested on every event, no delay of batch jobs at submit, finished jobs
purged after 2 s, quiet logs). The rounds rotate the sides, so a busy machine slows all alike. It prints each
round's jobs/s and CPU seconds per job (jobsite: its server's processes; Slurm: slurmctld, slurmd and what they
reaped, and apart the sbatch/squeue clients), the medians, and jobsite/Slurm against each configuration beside
the goal (2x), with the load average. Slurm is skipped with a message when slurmctld, slurmd or munged is not
installed (`apt-get install slurm-wlm munge`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.waiting import wait_for  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_cpu import (  # noqa: E402
    all_pids,
    cmdline,
    cpu_seconds,
    cpu_split_by_label,
    machine_busy_seconds,
    session_cpu_seconds,
    speed_line,
    tree_pids,
)

PY = str(ROOT / ".venv" / "bin" / "python")
GOAL = 2.0
PASSWORD = "bench-pass"


def _ts(text: str | None) -> float:
    """A time as SQLite keeps Django's (UTC, ISO), in seconds since the epoch."""
    if not text:
        return float("nan")
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- jobsite -------------------------------------------------------------------------------------------------

class Jobsite:
    """The embedded default in a fresh var dir, as `make run` starts it."""

    def __init__(self) -> None:
        self.var = Path(tempfile.mkdtemp(prefix="jobsite-bench-tput-"))
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
        self.env.update(PORT=str(self.port), JOBSITE_VAR_DIR=str(self.var / "var"), DEMO_PASSWORD=PASSWORD,
                        JOBSITE_LOCAL_USE_NVIDIA_SMI="false", JOBSITE_LOCAL_GPUS="8", LOG_LEVEL="WARNING")
        (self.var / "var").mkdir()
        for step in (["migrate", "--noinput"], ["seed_demo"],
                     ["shell", "-c", "from jobs.models import GroupQuota; "
                      "GroupQuota.objects.filter(group__name='research').update(quota=8, user_quota=8)"]):
            done = subprocess.run([PY, "manage.py", *step], cwd=ROOT, env=self.env, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"manage.py {step[0]} failed:\n{done.stderr[-3000:]}")
        self.log = open(self.var / "serve.log", "wb")
        self.proc = subprocess.Popen([PY, "manage.py", "serve"], cwd=ROOT, env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

        def answers() -> bool:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                c.request("GET", "/login/")
                return c.getresponse().status == 200
            except OSError:
                return False
        wait_for(answers, timeout=300, message="jobsite to serve")
        self.token = self.call("POST", "/api/v1/auth/token/", {"username": "lin", "password": PASSWORD})["token"]

    def call(self, method: str, path: str, body=None) -> dict:
        headers = {"Content-Type": "application/json"}
        if getattr(self, "token", None):
            headers["Authorization"] = f"Token {self.token}"
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=json.dumps(body) if body is not None else None,
                                  headers=headers)
                resp = self.conn.getresponse()
                data = resp.read()
                break
            except (http.client.HTTPException, OSError):
                if attempt:
                    raise
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        if resp.status >= 400:
            sys.exit(f"{method} {path}: HTTP {resp.status}: {data[:300]!r}")
        return json.loads(data) if data else {}

    def in_flight(self) -> int:
        for group in self.call("GET", "/api/v1/groups/")["results"]:
            if group["name"] == "research":
                return group["running_jobs"] + group["queued_jobs"]
        sys.exit("group research not found")

    def cpu(self) -> float:
        """CPU seconds of the server's processes (with what they reaped: the jobs' sandboxes) so far: the server
        and all it started (the local backend's launcher and network helpers run in sessions of their own)."""
        return cpu_seconds(self.pids())

    def pids(self) -> list[int]:
        """The server, all it started, and its local backend's launcher (which forks into the background). The
        replicas' supervisors detach from the launcher too and are reaped by init: only the machine-wide figure
        counts them."""
        launchers = [pid for pid in all_pids() if "launcher.py" in (cmd := cmdline(pid)) and str(self.var) in cmd]
        return tree_pids(self.proc.pid, *launchers)

    def rounds(self) -> dict[str, float]:
        """The scheduler's rounds so far (its /metrics, open in the embedded default): passes and sync rounds."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        found = {}
        for name in ("pass", "sync"):
            line = next((x for x in text.splitlines() if x.startswith(f"jobsite_scheduler_{name}_seconds_count")), "")
            found[name] = float(line.split()[-1]) if line else float("nan")
        return found

    def cpu_parts(self) -> dict[str, tuple[float, float]]:
        """CPU seconds so far by kind of the server's processes: their own, and what they reaped."""
        return cpu_split_by_label(self.pids())

    def run(self, jobs: int) -> float:
        body = {"group": "research", "image": "base-notebook", "instance_type": "gpu-1", "command": "true"}
        t0 = time.monotonic()
        for n in range(jobs):
            job = self.call("POST", "/api/v1/jobs/", {**body, "name": f"tput-{n}"})
            if n == 0:
                self.first_job = job["id"]
        self.submitted = time.monotonic() - t0
        wait_for(lambda: self.in_flight() == 0, timeout=1800, message="jobsite's jobs to end")
        self.wall = time.monotonic() - t0
        return jobs / self.wall

    def profile(self) -> None:
        """Where a trivial job's time went, from the database and the replicas' state files: the medians of each
        step from submit to the end the scheduler noticed."""
        db = sqlite3.connect(self.var / "var" / "jobsite.sqlite3")
        rows = db.execute(
            "SELECT j.id, j.created_at, a.started_at, a.launched_at, a.number, j.finished_at, "
            "(SELECT MIN(e.time) FROM jobs_jobevent e WHERE e.attempt_id = a.id AND e.reason = 'Started') "
            "FROM jobs_job j JOIN jobs_attempt a ON a.job_id = j.id WHERE j.phase = 'SUCCEEDED' AND j.id >= ?",
            (self.first_job,)).fetchall()
        db.close()
        steps: dict[str, list[float]] = {}
        state = self.var / "var" / "local" / "state"
        for job_id, submitted, admitted, launched, number, finished, started in rows:
            replica = state / f"job-{job_id}" / f"attempt-{number}" / "replica-0"
            try:
                # The backend's launch wrote ``launched``; the supervisor ``runner.pid`` when it began and
                # ``child.pid`` once the command ran; ``exit_code`` at its end.
                begun, ran, exited = ((replica / name).stat().st_mtime for name in ("runner.pid", "child.pid",
                                                                                    "exit_code"))
                written = float((replica / "launched").read_text())
            except (OSError, ValueError):
                continue
            times = [("submitted", _ts(submitted)), ("admitted", _ts(admitted)), ("launch claimed", _ts(launched)),
                     ("replica launched", written), ("supervisor began", begun), ("command started", ran),
                     ("exited", exited), ("seen running (event)", _ts(started)),
                     ("noticed (Succeeded)", _ts(finished))]
            for (_, a), (name, b) in zip(times, times[1:], strict=False):
                steps.setdefault(name, []).append(b - a)
        held = sum(_ts(finished) - _ts(admitted) for _, _, admitted, _, _, finished, _ in rows)
        print(f"profile of the last round: submits took {self.submitted:.1f} of its {self.wall:.1f} s; GPUs held "
              f"{held / (8 * self.wall):.0%} of the time (admission to the end noticed)")
        print(f"{len(rows)} jobs (median / p90 seconds since the step before):")
        for name, values in steps.items():
            values.sort()
            print(f"  {name:22} {statistics.median(values):7.3f} / {values[int(len(values) * 0.9)]:7.3f}")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.var, ignore_errors=True)


# --- Slurm ---------------------------------------------------------------------------------------------------

SLURM_CONF = """\
ClusterName=bench
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
{extra}NodeName=localhost CPUs=16 RealMemory=4000 Gres=gpu:8 State=UNKNOWN
PartitionName=main Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


# Slurm tuned for throughput (slurm.conf(5), SchedulerParameters and MinJobAge; the High Throughput Computing
# Administration Guide): the main scheduling loop tests every pending job each second instead of each minute and on
# every event that may free resources (a whole queue's depth), backfill runs each second, a batch job is scheduled at
# submit time (no batch delay), finished jobs leave slurmctld's memory after 2 s (the least the manual advises), and
# the daemons log errors only.
TUNED = {
    "SchedulerParameters": "sched_interval=1,sched_min_interval=0,bf_interval=1,default_queue_depth=10000,"
                           "batch_sched_delay=0,max_rpc_cnt=0",
    "MinJobAge": "2",
    "SlurmctldDebug": "error",
    "SlurmdDebug": "error",
    "JobCompType": "jobcomp/none",
    "PriorityType": "priority/basic",
}


def slurm_conf(d: Path, *, tuned: bool, ctld_port: int, slurmd_port: int) -> str:
    extra = "".join(f"{k}={v}\n" for k, v in TUNED.items()) if tuned else ""
    return SLURM_CONF.format(d=d, ctld_port=ctld_port, slurmd_port=slurmd_port, extra=extra)


class Slurm:
    """slurmctld and slurmd on this machine from a throwaway configuration (``tuned``: ``TUNED`` added to it);
    8 fake GPUs (null devices)."""

    @staticmethod
    def missing() -> str | None:
        for tool in ("slurmctld", "slurmd", "sbatch", "squeue", "munged"):
            if not shutil.which(tool):
                return f"{tool} not found (apt-get install slurm-wlm)"
        return None

    def __init__(self, *, tuned: bool) -> None:
        self.tuned = tuned
        self.dir = Path(tempfile.mkdtemp(prefix="jobsite-bench-slurm-"))
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir()
        for i in range(8):
            os.mknod(self.dir / f"gpu{i}", 0o666 | 0o020000, os.makedev(1, 3))
        (self.dir / "slurm.conf").write_text(slurm_conf(self.dir, tuned=tuned, ctld_port=free_port(),
                                                        slurmd_port=free_port()))
        (self.dir / "gres.conf").write_text(f"AutoDetect=off\nNodeName=localhost Name=gpu File={self.dir}/gpu[0-7]\n")
        self.env = {**os.environ, "SLURM_CONF": str(self.dir / "slurm.conf")}
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode:
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True)
        self.procs = [subprocess.Popen([daemon, "-D", *extra], env=self.env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.STDOUT, start_new_session=True)
                      for daemon, extra in (("slurmctld", ["-c", "-i"]), ("slurmd", []))]

        def idle() -> bool:
            out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True)
            return out.stdout.strip() == "idle"
        wait_for(idle, timeout=120, message="the Slurm node to be idle")

    def cpu(self) -> float:
        """CPU seconds of slurmctld and slurmd (with what they reaped) so far."""
        return sum(session_cpu_seconds(p.pid) for p in self.procs)

    def run(self, jobs: int) -> float:
        t0 = time.monotonic()
        for _ in range(jobs):
            subprocess.run(["sbatch", "-Q", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true"], env=self.env,
                           check=True)

        def drained() -> bool:
            out = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True)
            return out.returncode == 0 and not out.stdout.strip()
        wait_for(drained, timeout=1800, message="Slurm's jobs to end")
        return jobs / (time.monotonic() - t0)

    def stop(self) -> None:
        for proc in self.procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu() -> float:
    return time.process_time() + children_cpu()


def measured(side, jobs: int) -> tuple[float, float, float]:
    """Run ``jobs`` on ``side``: its jobs/s, its server's CPU seconds a job and its clients' (the sbatch and squeue
    processes this script starts; jobsite's client is this script's own HTTP calls, not counted). It prints beside
    them the whole machine's busy CPU a job less this script's and its clients' (processes that end unreaped, as
    Slurm's job steps do, count there only; on a busy machine it counts the other work too)."""
    server, clients, machine = side.cpu(), children_cpu(), machine_busy_seconds() - own_cpu()
    parts = side.cpu_parts() if isinstance(side, Jobsite) else {}
    rounds = side.rounds() if parts else {}
    rate = side.run(jobs)
    if parts:  # where jobsite's CPU went, a job
        now, rounds_now = side.cpu_parts(), side.rounds()
        print("  the scheduler's rounds a job: " + ", ".join(
            f"{name} {(rounds_now[name] - rounds[name]) / jobs:.2f}" for name in rounds))
        shares = [(name, (own - parts.get(name, (0, 0))[0]) / jobs, (reaped - parts.get(name, (0, 0))[1]) / jobs)
                  for name, (own, reaped) in now.items()]
        print("  jobsite's CPU a job by process (own + what it reaped): " + ", ".join(
            f"{name} {own * 1000:.1f} + {reaped * 1000:.1f} ms" for name, own, reaped in
            sorted(shares, key=lambda s: -(s[1] + s[2])) if own + reaped >= 0.0005))
    machine = (machine_busy_seconds() - own_cpu() - machine) / jobs
    print(f"  the machine's busy CPU a job, less this script and its clients: {machine * 1000:.1f} ms "
          f"(load {os.getloadavg()[0]:.1f})")
    return rate, (side.cpu() - server) / jobs, (children_cpu() - clients) / jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="print where jobsite's jobs spent their time")
    parser.add_argument("--no-slurm", action="store_true", help="run jobsite only")
    parser.add_argument("--slurm", choices=["both", "default", "tuned"], default="both",
                        help="which Slurm configurations to compare with (default: both)")
    parser.add_argument("--print-slurm-conf", action="store_true", help="print both Slurm configurations and stop")
    args = parser.parse_args()

    if args.print_slurm_conf:
        for tuned in (False, True):
            print(f"# --- Slurm {'tuned for throughput' if tuned else 'defaults'} ---")
            print(slurm_conf(Path("/tmp/DIR"), tuned=tuned, ctld_port=6817, slurmd_port=6818))
        return
    missing = "--no-slurm given" if args.no_slurm else Slurm.missing()
    if missing:
        print(f"Slurm skipped: {missing}")
    configs = [] if missing else [c for c in ("default", "tuned") if args.slurm in (c, "both")]
    names = ["jobsite", *(f"slurm-{c}" for c in configs)]
    load_before = os.getloadavg()
    speed = speed_line()
    site = Jobsite()
    rates: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    try:
        for rnd in range(1, args.rounds + 1):
            shift = (rnd - 1) % len(names)
            for name in names[shift:] + names[:shift]:
                side = site if name == "jobsite" else Slurm(tuned=name == "slurm-tuned")
                try:
                    rate, server, clients = measured(side, args.jobs)
                finally:
                    if side is not site:
                        side.stop()
                rates[name].append(rate)
                cpu[name].append((server, clients))
                extra = f", clients {clients * 1000:.1f} ms" if name != "jobsite" else ""
                print(f"round {rnd}: {name:13} {args.jobs} jobs, {rate:6.1f} jobs/s, CPU a job: server "
                      f"{server * 1000:.1f} ms{extra}   (load {os.getloadavg()[0]:.1f})", flush=True)
        if args.profile:
            site.profile()
    finally:
        site.stop()
    load = os.getloadavg()
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name in names:
        server = statistics.median(c[0] for c in cpu[name]) * 1000
        clients = statistics.median(c[1] for c in cpu[name]) * 1000
        extra = f" + clients {clients:.1f} ms" if name != "jobsite" else ""
        print(f"{name:13}: median {medians[name]:6.1f} jobs/s over {len(rates[name])} round(s); CPU a job "
              f"{server:.1f} ms{extra}")
    for config in configs:
        ratio = medians["jobsite"] / medians[f"slurm-{config}"]
        verdict = "met" if ratio >= GOAL else "missed"
        print(f"jobsite/Slurm ({config:7}) = {ratio:.2f}x   (goal >= {GOAL:.0f}x: {verdict})")
    print(f"load average (1/5/15 min): before {'/'.join(f'{x:.1f}' for x in load_before)}, after "
          f"{'/'.join(f'{x:.1f}' for x in load)}, on {os.cpu_count()} CPUs")
    print(f"{speed} (before the run)")


if __name__ == "__main__":
    main()
