"""Benchmark: how long `make run` takes to answer its first request, cold (a fresh var directory: migrations, static
files, demo data) and warm (the same directory again: everything already done). Goal: warm ≤ 3 s.

    .venv/bin/python bench/startup.py               # one cold start, then 3 warm ones
    .venv/bin/python bench/startup.py --warm 5 --command "make --no-print-directory run"

Each start runs the command with a free PORT and JOBSITE_VAR_DIR in a temporary directory (DATABASE_URL and
REDIS_URL dropped, as `make run` does), polls /healthz until it answers 200, then stops the process group. Prints,
per start, the seconds to the first 200, the CPU seconds the start used (user + system of the process group, which
the machine's load distorts less than wall time) and os.getloadavg(); the steps the server printed with their times.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_cpu import speed_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOAL_WARM_SECONDS = 3.0
DEADLINE_SECONDS = 600


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def start(command: list[str], var_dir: Path) -> tuple[float, float, list[str]]:
    """Seconds to the first 200 on /healthz, CPU seconds used, the lines the server printed about its steps."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(PORT=str(port), JOBSITE_VAR_DIR=str(var_dir), JOBSITE_LOCAL_USE_NVIDIA_SMI="false")
    log_path = var_dir.parent / f"{var_dir.name}.log"
    cpu_before = children_cpu()
    began = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        while not answers(f"http://127.0.0.1:{port}/healthz"):
            if proc.poll() is not None:
                sys.exit(f"the server exited ({proc.returncode}); see {log_path}")
            if time.monotonic() - began > DEADLINE_SECONDS:
                sys.exit(f"no answer in {DEADLINE_SECONDS} s; see {log_path}")
            time.sleep(0.05)
        elapsed = time.monotonic() - began
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    steps = [line.rstrip() for line in log_path.read_text().splitlines() if line.startswith("jobsite: [")]
    return elapsed, children_cpu() - cpu_before, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", type=int, default=3, help="warm starts after the cold one")
    parser.add_argument("--command", default="make --no-print-directory run", help="what starts the server")
    args = parser.parse_args()
    command = shlex.split(args.command)
    with tempfile.TemporaryDirectory(prefix="jobsite-startup-") as tmp:
        var_dir = Path(tmp) / "var"
        var_dir.mkdir()
        warm = []
        for n in range(args.warm + 1):
            what = "cold" if n == 0 else f"warm {n}"
            load = os.getloadavg()
            seconds, cpu, steps = start(command, var_dir)
            if n:
                warm.append(seconds)
            print(f"{what:7}  first 200 after {seconds:6.2f} s   CPU {cpu:5.2f} s   "
                  f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
            for line in steps:
                print(f"           {line}")
        if warm:
            worst = max(warm)
            verdict = "ok" if worst <= GOAL_WARM_SECONDS else "MISSED"
            print(f"warm start: median {sorted(warm)[len(warm) // 2]:.2f} s, worst {worst:.2f} s "
                  f"(goal ≤ {GOAL_WARM_SECONDS:.0f} s: {verdict}); load now {os.getloadavg()[0]:.2f}")
            print(speed_line())


if __name__ == "__main__":
    main()
