"""Benchmark: the CPU seconds one replica's launch costs on the local backend, all processes counted (issue 27).

    .venv/bin/python bench/launch_cpu.py --attempts 40

It launches ``--attempts`` trivial one-replica attempts (``true``) one after another through the real
``LocalBackend``, each waited for until its supervisor has written the exit code, twice: with the per-machine
launcher (launcher.py: a long-lived process that forks each supervisor from its preloaded modules) and without it
(a Python interpreter started per replica, as before). Every process of the run (this one, the launcher, the
supervisors, bubblewrap, the command) is in a cpuacct cgroup made for the run, so the CPU per launch is the
cgroup's usage over the attempts; the scheduler's own share (``launch()``) is this process's CPU time. Wall
figures are medians. The machine's load (``os.getloadavg()``) is printed before and after. Needs root (a cgroup
v1 cpuacct hierarchy at /sys/fs/cgroup/cpuacct): without it, only the scheduler's share is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from scheduler.backend_factory import local_backend  # noqa: E402
from scheduler.values import LaunchReplica, LaunchSpec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_cpu import speed_line  # noqa: E402

GIB = 1 << 30
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
GOAL_MS = 40.0  # a job's whole life (issue 27): the launch is one part of it


def cgroup() -> Path | None:
    """A cpuacct cgroup holding this process (and so all it starts from now on); None when none can be made."""
    path = CPUACCT / f"jobsite-bench-launch-{os.getpid()}"
    try:
        path.mkdir()
        (path / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return None
    return path


def usage(group: Path | None, kind: str = "") -> float:
    """The cgroup's CPU seconds so far (kind: "" all, "_sys" in the kernel)."""
    return int((group / f"cpuacct.usage{kind}").read_text()) / 1e9 if group is not None else float("nan")


def run(label: str, attempts: int, root: Path, group: Path | None, launcher: bool) -> None:
    settings.JOBSITE_LOCAL_LAUNCHER = launcher
    backend = local_backend(root=root / label.replace(" ", "-"), gpus=8)
    if launcher and backend.launcher is not None:
        backend.launcher.start()  # listening before the first launch (which otherwise starts it in the background)
    walls, own = [], 0.0
    job_ids = range(1, attempts + 2)  # the first warms up (and starts the launcher): not counted
    for job_id in job_ids:
        spec = LaunchSpec(job_id=job_id, attempt_id=job_id, attempt_number=1, command="true", image="",
                          replicas=[LaunchReplica(rank=0, node="local", gpu_ids=(), env={})],
                          request={"gpu": 0, "cpu": 500, "memory": GIB})
        exit_file = backend.root / "state" / f"job-{job_id}" / "attempt-1" / "replica-0" / "exit_code"
        if job_id == 2:
            start_usage, start_sys, start_own = usage(group), usage(group, "_sys"), time.process_time()
        t0 = time.perf_counter()
        backend.launch(spec)
        deadline = t0 + 120
        while not exit_file.exists():
            if time.perf_counter() > deadline:
                raise SystemExit(f"{label}: attempt {job_id} did not end within 120 s")
            time.sleep(0.002)
        if job_id > 1:
            walls.append(time.perf_counter() - t0)
        backend.observe(job_id=job_id, attempt_number=1, replicas=1)  # reaps what it started
    time.sleep(0.5)  # the last supervisor's few instructions after its exit code
    total = (usage(group) - start_usage) / attempts
    kernel = (usage(group, "_sys") - start_sys) / attempts
    own = (time.process_time() - start_own) / attempts
    print(f"{label:<24} all processes {total * 1000:6.1f} ms CPU/launch ({kernel * 1000:5.1f} in the kernel)   "
          f"scheduler {own * 1000:5.1f} ms   "
          f"launch to exit median {statistics.median(walls) * 1000:6.1f} ms   (sandbox "
          f"{'on' if backend.bwrap else 'off'}, network {backend.network or 'machine'}, limits {backend.limits.mode})")
    if backend.launcher is not None:
        backend.launcher.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempts", type=int, default=40)
    parser.add_argument("--only", choices=("launcher", "interpreter"), help="one of the two ways only")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the run, e.g. JOBSITE_LOCAL_JOB_NETWORK=none, JOBSITE_LOCAL_LIMITS=off")
    args = parser.parse_args()
    for item in args.set:
        name, _, value = item.partition("=")
        setattr(settings, name, value)
    group = cgroup()
    print(f"load before {os.getloadavg()}  cpus {os.cpu_count()}  uid {os.geteuid()}  "
          f"cgroup {group or 'none (scheduler share only)'}   goal: a job's whole life <= {GOAL_MS:.0f} ms CPU")
    print(speed_line())
    root = Path(tempfile.mkdtemp(prefix="jobsite-bench-launch-cpu-"))
    try:
        for launcher in (True, False):
            if args.only in (None, "launcher" if launcher else "interpreter"):
                run("launcher (fork)" if launcher else "interpreter per replica", args.attempts, root, group,
                    launcher)
    finally:
        if group is not None:
            (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
            time.sleep(0.2)
            try:
                group.rmdir()
            except OSError as exc:  # a process of the run still in it
                print(f"cgroup {group} left: {exc}")
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
