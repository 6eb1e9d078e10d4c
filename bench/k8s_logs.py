"""Benchmark: pod log archiving with 1,000 running pods, without and with the log request budget.

    .venv/bin/python bench/k8s_logs.py [--pods 1000] [--seconds 20] [--budget 20]

Starts the Kubernetes API emulator (tests/k8s/emulator.py) in this process with ``--pods`` pods, each writing a
line a second. For each setting (``requests_per_second`` 0, as before the budget, then ``--budget``) a
LogArchiver with the default refresh (5 s) and 8 workers is handed every pod once a second, as the sync loop does,
for ``--seconds``, while 5 pods a second are created next to it. Prints the pod log requests a second, the CPU
seconds of this process (emulator included) a second, the create latency p50 / max, the pods waiting for the
budget at the end, and the load average. Nothing is asserted; the figures depend on the machine's load.

First, a simulated run that does not depend on the load (the emulator, the archiver and the sync loop share this
process, so on a busy machine the real-time run cannot reach the demand): the clock is injected, fetches run in
the calling thread, and the requests made in each simulated second are counted (mean and max), with the CPU
seconds the whole run took.
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

from kubernetes import client  # noqa: E402

from scheduler.backends.k8s_logs import LogArchiver  # noqa: E402
from tests.k8s.emulator import EmulatorServer  # noqa: E402

NAMESPACE = "bench"
REFRESH_SECONDS = 5.0
SIMULATED_SECONDS = 10


def pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


def run(server: EmulatorServer, core: client.CoreV1Api, pods: list[str], *, seconds: float, budget: float,
        tag: str) -> None:
    emu = server.emu
    root = Path(tempfile.mkdtemp(prefix=f"jobsite-bench-logs-{tag}-"))
    archiver = LogArchiver(core=core, namespace=NAMESPACE, container="main", workers=8,
                           refresh_seconds=REFRESH_SECONDS, requests_per_second=budget)
    creates: list[float] = []
    requests0, cpu0, start = emu.log_requests, time.process_time(), time.monotonic()
    round_no = 0
    while time.monotonic() - start < seconds:
        round_no += 1
        for name in pods:
            emu.emit(NAMESPACE, name, f"round {round_no} of {name}\n")
            archiver.follow(name, root / f"{name}.log", restarts=0)
        for i in range(5):
            t0 = time.monotonic()
            core.create_namespaced_pod(NAMESPACE, pod(f"new-{tag}-{round_no}-{i}"))
            creates.append(time.monotonic() - t0)
        time.sleep(max(0.0, start + round_no - time.monotonic()))
    elapsed = time.monotonic() - start
    requests, cpu = emu.log_requests - requests0, time.process_time() - cpu0
    waiting = archiver.stats.waiting
    archiver.close(wait=True)
    label = "before (no budget)" if budget <= 0 else f"after (budget {budget:g}/s)"
    print(f"{label:24} {requests / elapsed:7.1f} log requests/s   {cpu / elapsed:5.2f} CPU s/s   "
          f"create p50 {statistics.median(creates) * 1000:6.1f} ms max {max(creates) * 1000:6.1f} ms   "
          f"{waiting} pods waiting at the end")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def simulate(server: EmulatorServer, core: client.CoreV1Api, pods: list[str], *, seconds: int,
             budget: float) -> None:
    emu, clock = server.emu, Clock()
    root = Path(tempfile.mkdtemp(prefix="jobsite-bench-logs-sim-"))
    archiver = LogArchiver(core=core, namespace=NAMESPACE, container="main", workers=0,
                           refresh_seconds=REFRESH_SECONDS, requests_per_second=budget, clock=clock)
    counts, cpu0, ticks = [], time.process_time(), 100
    for second in range(seconds):
        before = emu.log_requests
        for tick in range(ticks):
            clock.now = second + tick / ticks
            if tick == 0:  # a sync round
                for name in pods:
                    emu.emit(NAMESPACE, name, f"second {second} of {name}\n")
                    archiver.follow(name, root / f"{name}.log", restarts=0)
            archiver.pump()
        counts.append(emu.log_requests - before)
    cpu = time.process_time() - cpu0
    archiver.close(wait=True)
    label = "before (no budget)" if budget <= 0 else f"after (budget {budget:g}/s)"
    print(f"{label:24} {statistics.mean(counts):7.1f} log requests per simulated s (max {max(counts)})   "
          f"{cpu:6.2f} CPU s for {seconds} simulated s (emulator included)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--budget", type=float, default=20.0)
    args = parser.parse_args()
    server = EmulatorServer().start()
    try:
        core = client.CoreV1Api(server.api_client())
        pods = [f"job-{i}-1-0" for i in range(args.pods)]
        for name in pods:
            core.create_namespaced_pod(NAMESPACE, pod(name))
        print(f"simulated: {args.pods} running pods, each writing a line a second, refresh {REFRESH_SECONDS:g} s, "
              f"{SIMULATED_SECONDS} simulated s, load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        simulate(server, core, pods, seconds=SIMULATED_SECONDS, budget=0)
        simulate(server, core, pods, seconds=SIMULATED_SECONDS, budget=args.budget)
        print(f"real time: {args.pods} running pods, each writing a line a second, refresh {REFRESH_SECONDS:g} s, "
              f"{args.seconds:g} s each, load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        run(server, core, pods, seconds=args.seconds, budget=0, tag="before")
        run(server, core, pods, seconds=args.seconds, budget=args.budget, tag="after")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
