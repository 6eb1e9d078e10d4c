"""Two scheduler processes on the emulator: one leads (a Lease), the leader is killed -9, the standby takes over
within 25 s (the lease as deployed: 15 s, plus up to two 2 s retries and a busy machine's margin), re-lists, and a
job submitted after the kill runs; nothing is launched twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import kmock
import pytest
from django.db import connection

from jobs.choices import Phase

from ..e2e.api import free_port
from .conftest import NAMESPACE, wait_for

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def database_url() -> str:
    s = connection.settings_dict
    return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


METRICS_TOKEN = "failover-metrics-token"


class Scheduler:
    def __init__(self, name: str, k8s, tmp_path: Path):
        self.name = name
        self.port = free_port()
        self.log = open(tmp_path / f"{name}.log", "wb")
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL",)}
        env.update(
            DATABASE_URL=database_url(), DJANGO_SETTINGS_MODULE="jobsite.settings", JOBSITE_BACKEND="kubernetes",
            KUBECONFIG=os.environ["KUBECONFIG"], JOBSITE_K8S_NAMESPACE=NAMESPACE, JOBSITE_LEADER_ELECTION="lease",
            JOBSITE_LEADER_NAMESPACE=NAMESPACE, POD_NAME=name, JOBSITE_SCHEDULER_MODE="process",
            JOBSITE_SCHEDULER_HTTP_PORT=str(self.port), JOBSITE_LOG_ROOT=str(k8s.tmp_logs),
            JOBSITE_SCHEDULER_INTERVAL="0.5",  # the lease as deployed: 15 s, renew deadline 10 s, retry 2 s
            JOBSITE_K8S_API_RETRY_BASE_SECONDS="0.05",
            JOBSITE_METRICS_TOKEN=METRICS_TOKEN,  # production: the scheduler's /metrics wants its token
            # One installation, as deployed (one Secret for all): the new leader watches and adopts the old one's pods.
            JOBSITE_INSTALLATION_ID="failover",
        )
        self.proc = subprocess.Popen([sys.executable, "manage.py", "runscheduler"], cwd=ROOT, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def leader(self) -> bool | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5) as r:
                return json.loads(r.read())["leader"]
        except OSError:
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(20)
        self.log.close()


def test_the_standby_takes_over_within_25_s_of_a_kill_9_and_runs_new_jobs(submit, world, kubelet, k8s, settings,
                                                                          tmp_path, core):
    k8s.emu.resources["coordination.k8s.io/v1/leases"] = kmock.ResourceInfo(kind="Lease", namespaced=True)
    settings.JOBSITE_SCHEDULER_MODE = "process"  # the test is the web: it wakes the schedulers with NOTIFY
    a = Scheduler("scheduler-a", k8s, tmp_path)
    b = None
    try:
        wait_for(lambda: a.leader() is True, timeout=60, what="scheduler-a leading")
        b = Scheduler("scheduler-b", k8s, tmp_path)
        wait_for(lambda: b.leader() is False, timeout=60, what="scheduler-b standing by")

        first = submit("bob", "gpu-1")
        name1 = f"job-{first.pk}-1-0"
        wait_for(lambda: _pod(core, name1), timeout=30, what="the first job's pod")
        kubelet.running(name1)
        wait_for(lambda: _phase(first) == Phase.RUNNING, timeout=30, what="the first job running")
        lists_before = _lists(k8s.emu)

        a.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        second = submit("pan", "gpu-1")
        wait_for(lambda: b.leader() is True, timeout=30, what="scheduler-b leading")
        takeover = time.monotonic() - killed
        print(f"takeover {takeover:.1f} s after the kill")
        assert takeover < 25, f"took {takeover:.1f} s"
        wait_for(lambda: _lists(k8s.emu) > lists_before, timeout=30,  # its watches list from their own threads
                 what="the new leader re-listing the pods")

        name2 = f"job-{second.pk}-1-0"
        wait_for(lambda: _pod(core, name2), timeout=30, what="the second job's pod")
        kubelet.running(name2)
        wait_for(lambda: _phase(second) == Phase.RUNNING, timeout=30, what="the second job running")
        posts = [p for m, p, q, _ in k8s.emu.journal if m == "POST" and p.endswith("/pods")]
        assert len(posts) == 2, posts  # one pod each: nothing launched twice
        assert _phase(first) == Phase.RUNNING  # the running job was not disturbed

        # The new leader's /metrics: leadership, its fresh list, the pods it watches, the admission it made.
        def figures() -> dict[str, float]:
            request = urllib.request.Request(f"http://127.0.0.1:{b.port}/metrics",
                                             headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
            with urllib.request.urlopen(request, timeout=10) as r:
                text = r.read().decode()
            return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line and not line.startswith("#")}

        wait_for(lambda: figures().get('jobsite_pods{phase="Running"}') == 2, timeout=30, what="pods by phase")
        seen = figures()
        assert seen["jobsite_scheduler_leader"] == 1
        assert seen['jobsite_informer_relists_total{resource="pods"}'] >= 1
        assert seen["jobsite_admission_latency_seconds_count"] >= 1
        assert seen["jobsite_scheduler_pass_seconds_count"] >= 1
    finally:
        a.stop()
        if b is not None:
            b.stop()
        for s in (a, b):
            if s is not None:
                print(f"--- {s.name}\n" + (tmp_path / f"{s.name}.log").read_text()[-3000:])


def _pod(core, name: str) -> bool:
    return any(p.metadata.name == name for p in core.list_namespaced_pod(NAMESPACE).items)


def _phase(job) -> str:
    job.refresh_from_db()
    return job.phase


def _lists(emu) -> int:
    return sum(1 for m, p, q, _ in emu.journal if m == "GET" and p.endswith("/pods") and q.get("watch") != "true")
