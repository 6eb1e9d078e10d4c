"""Benchmark: what a job's boundary adds to a launch on the local backend (issue 20).

    .venv/bin/python bench/launch_isolation.py --attempts 30

For each way of running a replica (unsandboxed; the bubblewrap sandbox on the machine's network, as before
issue 20; the sandbox in its attempt's own network namespace, loopback only and outbound; with the replica's
cgroup limits when the machine has them), it launches ``--attempts`` trivial one-replica attempts (``true``) one
after another through the real ``LocalBackend`` and prints the median and p90 of:
  - launch: the scheduler's side, ``launch()`` returning (wall, and the scheduler's CPU seconds per launch);
  - to exit: from the call to the exit code written by the supervisor (the whole start of a replica);
and, alone, the median cost of making and ending an attempt's network namespace. The machine's load
(``os.getloadavg()``) is printed before and after: on a busy machine every figure grows.
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
from scheduler.backends import netns  # noqa: E402
from scheduler.backends.local import LocalBackend  # noqa: E402
from scheduler.values import LaunchReplica, LaunchSpec  # noqa: E402

GIB = 1 << 30


def quantiles(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return f"median {statistics.median(ordered) * 1000:7.1f} ms  p90 {p90 * 1000:7.1f} ms"


def run(label: str, attempts: int, root: Path, **overrides) -> None:
    for name, value in overrides.items():
        setattr(settings, name, value)
    backend = local_backend(root=root / label.replace(" ", "-"), gpus=8)
    launch, total, cpu = [], [], []
    for job_id in range(1, attempts + 1):
        spec = LaunchSpec(job_id=job_id, attempt_id=job_id, attempt_number=1, command="true", image="",
                          replicas=[LaunchReplica(rank=0, node="local", gpu_ids=(), env={})],
                          request={"gpu": 0, "cpu": 500, "memory": GIB})
        exit_file = backend.root / "state" / f"job-{job_id}" / "attempt-1" / "replica-0" / "exit_code"
        c0, t0 = time.process_time(), time.perf_counter()
        backend.launch(spec)
        launch.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        deadline = t0 + 120
        while not exit_file.exists():
            if time.perf_counter() > deadline:
                raise SystemExit(f"{label}: attempt {job_id} did not end within 120 s")
            time.sleep(0.002)
        total.append(time.perf_counter() - t0)
        backend.observe(job_id=job_id, attempt_number=1, replicas=1)  # reaps the launchers
    sandbox = "on" if backend.bwrap else "off"
    print(f"{label:<34} launch {quantiles(launch)}  cpu {statistics.median(cpu) * 1000:5.1f} ms"
          f"   to exit {quantiles(total)}   (sandbox {sandbox}, network {backend.network or 'machine'})")


def network_alone(samples: int) -> None:
    for mode in ("none", "outbound"):
        facts = netns.host_facts(mode)
        if mode == "outbound" and not facts.outbound:
            print("network namespace, outbound: no slirp4netns here")
            continue
        times = []
        for _ in range(samples):
            t0 = time.perf_counter()
            network = netns.open_network(facts, "bench:0:0")
            network.close()  # no supervisor holds it: it ends at once
            for p in network.processes:
                p.wait(timeout=30)
            times.append(time.perf_counter() - t0)
        print(f"network namespace alone, {mode:<8}  make and end {quantiles(times)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempts", type=int, default=30)
    args = parser.parse_args()
    print(f"load before {os.getloadavg()}  cpus {os.cpu_count()}  uid {os.geteuid()}")
    root = Path(tempfile.mkdtemp(prefix="jobsite-bench-launch-"))
    network_alone(args.attempts)
    limits = {"JOBSITE_LOCAL_LIMITS": "off"} if hasattr(settings, "JOBSITE_LOCAL_LIMITS") else {}
    run("unsandboxed", args.attempts, root, JOBSITE_LOCAL_SANDBOX="off", **limits)
    # The machine's network: what the sandbox was before issue 20 (no namespace of its own).
    original = LocalBackend.__init__

    def machine_network(self, *a, **kw):
        original(self, *a, **kw)
        self.network = None

    LocalBackend.__init__ = machine_network
    run("sandbox, machine's network", args.attempts, root, JOBSITE_LOCAL_SANDBOX="bwrap", **limits)
    LocalBackend.__init__ = original
    run("sandbox, own network (none)", args.attempts, root, JOBSITE_LOCAL_JOB_NETWORK="none", **limits)
    run("sandbox, own network (outbound)", args.attempts, root, JOBSITE_LOCAL_JOB_NETWORK="outbound", **limits)
    if limits:
        run("sandbox, outbound, cgroup limits", args.attempts, root, JOBSITE_LOCAL_LIMITS="auto")
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
