"""Benchmark: the scheduler on the Kubernetes API emulator with many running pods, each with a growing log.

    createdb -h 127.0.0.1 -U postgres jobsite_bench_cp
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobsite_bench_cp .venv/bin/python bench/control_plane.py \
        --pods 1000 --log-kb 200

The database is emptied and refilled each run. With 10 and then ``--pods`` running pods (each with a log of
``--log-kb``), it prints: the median time of a scheduling pass (50 jobs waiting behind a full group quota, so
every pass re-decides them), the time of a sync round that reads every pod and hands its new log lines to the
archiver (until the archiver is idle), and that round's pod-log traffic after every log grew by one 100-byte line,
next to the total size of the logs (what a full copy per round would download).
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

from tests.k8s.emulator import EmulatorServer, kubeconfig  # noqa: E402
from tests.waiting import wait_for  # noqa: E402

NAMESPACE = "bench"
TMP = Path(tempfile.mkdtemp(prefix="jobsite-bench-cp-"))
SERVER = EmulatorServer().start()
(TMP / "kubeconfig").write_text(kubeconfig(SERVER.url))
os.environ.update(
    DJANGO_SETTINGS_MODULE="jobsite.settings", JOBSITE_SCHEDULER_MODE="inprocess", JOBSITE_BACKEND="kubernetes",
    KUBECONFIG=str(TMP / "kubeconfig"), JOBSITE_K8S_NAMESPACE=NAMESPACE, JOBSITE_LOG_ROOT=str(TMP / "logs"),
    JOBSITE_K8S_LOG_REFRESH_SECONDS="0", JOBSITE_K8S_LOG_WORKERS="8", LOG_LEVEL="WARNING",
    JOBSITE_K8S_LOG_REQUESTS_PER_SECOND="0",  # measures the archiver unpaced, as before the polling budget
    JOBSITE_PREPARING_TIMEOUT_SECONDS="86400",  # setting up 1,000 pods on the emulator takes minutes
)

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.models import Count  # noqa: E402
from kubernetes import client  # noqa: E402

from jobs import services  # noqa: E402
from jobs.choices import Resource, Role  # noqa: E402
from jobs.models import Group, GroupQuota, Image, InstanceType, Job, Membership  # noqa: E402
from scheduler.backend_factory import get_backend  # noqa: E402
from scheduler.passes import schedule_pass  # noqa: E402
from scheduler.sync import sync_jobs  # noqa: E402

LINE = "x" * 99 + "\n"


def world():
    user = get_user_model().objects.create_user("bench", password="bench")
    image = Image.objects.create(name="bench-image", url="busybox:latest")
    cpu = InstanceType.objects.create(name="bench-cpu", cpu_millicores=100, memory_bytes=1 << 26)
    gpu = InstanceType.objects.create(name="bench-gpu", gpu=1)
    groups = {}
    for name, quota in (("running", None), ("waiting", 1)):
        group = Group.objects.create(name=name)
        GroupQuota.objects.create(group=group, resource=Resource.GPU, quota=quota)
        Membership.objects.create(group=group, user=user, role=Role.MEMBER)
        image.groups.add(group)
        cpu.groups.add(group)
        gpu.groups.add(group)
        groups[name] = group
    return user


def submit(user, group: str, instance_type: str, n: int) -> None:
    for i in range(n):
        spec = services.job_spec_validate(user=user, data={"group": group, "image": "bench-image",
                                                            "instance_type": instance_type, "command": f"run {i}"})
        services.job_submit(user=user, spec=spec)


def run_pods(core, emu, log_kb: int) -> int:
    """Every launched pod running, with a log of ``log_kb`` (the kubelet's part). Returns the total log bytes."""
    lines = max(1, log_kb * 1024 // len(LINE))
    total = 0
    for pod in core.list_namespaced_pod(NAMESPACE).items:
        name = pod.metadata.name
        if (NAMESPACE, name) in emu.logs:
            total += sum(len(line) for _ts, line in emu.logs[(NAMESPACE, name)])
            continue
        core.patch_namespaced_pod_status(name, NAMESPACE, {"status": {
            "phase": "Running", "startTime": "2026-01-01T00:00:00Z", "containerStatuses": [{
                "name": "main", "image": "busybox", "imageID": "", "ready": True, "restartCount": 0,
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}, _preload_content=False)
        # Written over the last minutes, a line every 50 ms, as a training loop prints.
        emu.emit(NAMESPACE, name, LINE * lines, at=time.time_ns() - lines * 50_000_000, step_ns=50_000_000)
        total += len(LINE) * lines
    return total


def sync_round(backend) -> float:
    started = time.perf_counter()
    sync_jobs(backend=backend)
    backend.archiver.wait_idle(600)
    return time.perf_counter() - started


def measure(label: str, backend, core, emu, log_kb: int, repeat: int) -> dict:
    total = run_pods(core, emu, log_kb)
    wait_for_cache(backend, core)
    sync_round(backend)  # the first copy of every log
    passes = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        schedule_pass(backend=backend)
        passes.append(time.perf_counter() - t0)
    for pod in core.list_namespaced_pod(NAMESPACE).items:
        emu.emit(NAMESPACE, pod.metadata.name, LINE)
    served, requests = emu.log_bytes_served, emu.log_requests
    seconds = sync_round(backend)
    running = Job.objects.filter(phase="RUNNING").count()
    others = dict(Job.objects.exclude(phase__in=["RUNNING", "PENDING"]).values_list("phase").annotate(n=Count("id")))
    if others:
        print(f"  (other phases: {others})", flush=True)
    row = {"label": label, "running": running, "pass_ms": statistics.median(passes) * 1000,
           "sync_s": seconds, "log_total_mb": total / 1e6, "round_kb": (emu.log_bytes_served - served) / 1e3,
           "round_requests": emu.log_requests - requests}
    print(f"{label:>12}: {running:5d} running pods | pass p50 {row['pass_ms']:7.1f} ms | sync round "
          f"{seconds:6.2f} s | logs {row['log_total_mb']:7.1f} MB in all, one round after +100 B/pod: "
          f"{row['round_kb']:8.1f} kB in {row['round_requests']} requests", flush=True)
    return row


def wait_for_cache(backend, core) -> None:
    names = {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}

    def caught_up() -> bool:
        cached = {p["metadata"]["name"]: p for p in backend.pods_informer.items()}
        return all(n in cached and (cached[n].get("status") or {}).get("phase") == "Running" for n in names)

    wait_for(caught_up, timeout=120, interval=0.1, message="the watch to catch up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--log-kb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("Point DATABASE_URL at a PostgreSQL database made for this benchmark.")
    call_command("migrate", verbosity=0)
    call_command("flush", "--noinput", verbosity=0)
    user = world()
    backend = get_backend()
    backend.start()
    core = client.CoreV1Api(SERVER.api_client())
    emu = SERVER.emu
    submit(user, "waiting", "bench-gpu", 50)
    rows = []
    try:
        for label, n in (("10 pods", 10), (f"{args.pods} pods", args.pods)):
            submit(user, "running", "bench-cpu", n - Job.objects.filter(group__name="running").count())
            schedule_pass(backend=backend)
            sync_jobs(backend=backend)  # launches
            rows.append(measure(label, backend, core, emu, args.log_kb, args.repeat))
            sync_jobs(backend=backend)  # PREPARING -> RUNNING seen
        small, big = rows
        print(f"pass with {big['running']} pods / with {small['running']}: {big['pass_ms'] / small['pass_ms']:.2f}x; "
              f"a round's log traffic is {big['round_kb'] / (big['log_total_mb'] * 1e3) * 100:.2f}% of the logs' "
              f"size (a full copy per round: {big['log_total_mb']:.1f} MB)")
    finally:
        backend.close()
        SERVER.stop()


if __name__ == "__main__":
    main()
