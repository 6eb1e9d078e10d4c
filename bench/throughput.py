"""Benchmark: end-to-end throughput of trivial jobs, jobsite's embedded default against Slurm on this machine.

    .venv/bin/python bench/throughput.py                 # 1,000 jobs each, 1 round
    .venv/bin/python bench/throughput.py --jobs 200 --rounds 3
    .venv/bin/python bench/throughput.py --jobs 200 --no-slurm --profile   # jobsite alone, where its time went

Both sides get the same work: ``--jobs`` jobs of ``true``, each asking for one of 8 GPUs, submitted one by one
(each submit waits for its answer), and the clock stops when the last one has ended. jobsite runs as `make run`
starts it (SQLite, the in-process scheduler, the local backend with 8 GPUs and no nvidia-smi) and is submitted to
through its API with one kept-alive connection; the demo user lin may use all 8 GPUs of the group research. Slurm
(Debian's slurm-wlm: slurmctld and slurmd from a throwaway configuration, one node with 16 CPUs and 8 fake GPUs,
backfill scheduler, no accounting) gets `sbatch --gres=gpu:1 --wrap true`. The rounds alternate the two, so a
busy machine slows both alike. It prints each round's jobs/s, the medians, and jobsite/Slurm beside the goal (2x).
Slurm is skipped with a message when slurmctld, slurmd or munged is not installed (`apt-get install slurm-wlm`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
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
            exit_file = state / f"job-{job_id}" / f"attempt-{number}" / "replica-0" / "exit_code"
            try:
                exited = exit_file.stat().st_mtime
            except OSError:
                continue
            times = [("submitted", _ts(submitted)), ("admitted", _ts(admitted)), ("launch claimed", _ts(launched)),
                     ("launch returned", _ts(started)), ("exited", exited), ("noticed (Succeeded)", _ts(finished))]
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
NodeName=localhost CPUs=16 RealMemory=4000 Gres=gpu:8 State=UNKNOWN
PartitionName=main Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


class Slurm:
    """slurmctld and slurmd on this machine from a throwaway configuration; 8 fake GPUs (null devices)."""

    @staticmethod
    def missing() -> str | None:
        for tool in ("slurmctld", "slurmd", "sbatch", "squeue", "munged"):
            if not shutil.which(tool):
                return f"{tool} not found (apt-get install slurm-wlm)"
        return None

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="jobsite-bench-slurm-"))
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir()
        for i in range(8):
            os.mknod(self.dir / f"gpu{i}", 0o666 | 0o020000, os.makedev(1, 3))
        (self.dir / "slurm.conf").write_text(SLURM_CONF.format(d=self.dir, ctld_port=free_port(),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="print where jobsite's jobs spent their time")
    parser.add_argument("--no-slurm", action="store_true", help="run jobsite only")
    args = parser.parse_args()

    missing = "--no-slurm given" if args.no_slurm else Slurm.missing()
    if missing:
        print(f"Slurm skipped: {missing}")
    site = Jobsite()
    slurm = None if missing else Slurm()
    rates: dict[str, list[float]] = {"jobsite": [], "slurm": []}
    try:
        for rnd in range(1, args.rounds + 1):
            sides = [("jobsite", site), ("slurm", slurm)]
            for name, side in (sides if rnd % 2 else sides[::-1]):
                if side is None:
                    continue
                rate = side.run(args.jobs)
                rates[name].append(rate)
                print(f"round {rnd}: {name:7} {args.jobs} jobs, {rate:6.1f} jobs/s", flush=True)
        if args.profile:
            site.profile()
    finally:
        site.stop()
        if slurm is not None:
            slurm.stop()
    load = os.getloadavg()[0]
    site_rate = statistics.median(rates["jobsite"])
    print(f"jobsite: median {site_rate:.1f} jobs/s over {len(rates['jobsite'])} round(s)")
    if rates["slurm"]:
        slurm_rate = statistics.median(rates["slurm"])
        print(f"Slurm:   median {slurm_rate:.1f} jobs/s")
        print(f"jobsite/Slurm = {site_rate / slurm_rate:.2f}x   (goal >= {GOAL:.0f}x; load average {load:.1f})")


if __name__ == "__main__":
    main()
