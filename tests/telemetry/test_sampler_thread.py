"""The GPU reads happen off the scheduler's sync round (issue 24): an exporter that does not answer holds its own
thread, never a round, and its readings are stored once it answers."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from django.utils import timezone

from jobs import services
from jobs.choices import Phase
from jobs.models import GpuSeries, Job
from scheduler.loop import SchedulerLoop
from scheduler.telemetry import step
from scheduler.telemetry.nvml import NvmlSampler
from tests.scheduler.test_loop import Switch
from tests.waiting import wait_for

from .fake_nvml import FIXTURES, FakeNvml
from .test_step import running_on

pytestmark = pytest.mark.django_db(transaction=True)
LOCAL = SimpleNamespace(name="local")


@pytest.fixture
def hanging_exporter():
    """An exporter that takes each request and answers only once ``release`` is set."""
    state = SimpleNamespace(release=threading.Event(), asked=threading.Event(), text="", requests=0)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            state.requests += 1
            state.asked.set()
            state.release.wait(300)
            data = state.text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    yield state
    state.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    monkeypatch.setattr(step, "_state", step.fresh_state())


def test_a_hanging_exporter_holds_up_no_sync_round(settings, submit, monkeypatch, hanging_exporter):
    monkeypatch.setattr(step, "SCRAPE_TIMEOUT", 300.0)  # far longer than anything here waits
    settings.JOBSITE_GPU_METRICS_URL = hanging_exporter.url
    settings.JOBSITE_GPU_SAMPLE_SECONDS = 0.2
    settings.JOBSITE_K8S_NAMESPACE = "jobsite"
    settings.JOBSITE_SCHEDULER_INTERVAL = 0.1
    settings.JOBSITE_LEADER_RETRY_SECONDS = 0.1
    # A job on Kubernetes GPUs, as the exporter attributes them (the local scheduler leaves its attempt alone).
    on_gpus = submit("bob", "gpu-2")
    services.job_transition(job=on_gpus, phase=Phase.PENDING)
    services.job_admit(job=on_gpus, backend="kubernetes", placement=[{"node": "gpu-node-a"}])
    services.job_transition(job=on_gpus, phase=Phase.RUNNING)
    hanging_exporter.text = (FIXTURES / "dcgm_scrape.txt").read_text().replace(
        'pod="job-12-1-', f'pod="job-{on_gpus.pk}-1-')
    loop = SchedulerLoop(elector=Switch(leading=True))
    loop.start()
    try:
        wait_for(hanging_exporter.asked.is_set, timeout=60, message="the leader's sampler to ask the exporter")
        # The exporter holds its request; rounds go on: a job is admitted, runs and succeeds meanwhile.
        job = submit("bob", command="true")
        wait_for(lambda: Job.objects.get(pk=job.pk).phase == Phase.SUCCEEDED, timeout=90,
                 message=lambda: f"SUCCEEDED, not {Job.objects.get(pk=job.pk).status}")
        assert not hanging_exporter.release.is_set() and hanging_exporter.requests == 1  # one read under way, no pile
        assert not GpuSeries.objects.exists()

        hanging_exporter.release.set()  # it answers: the next round stores what it said
        wait_for(lambda: GpuSeries.objects.filter(attempt__job=on_gpus, resolution=10).count() == 2, timeout=60,
                 message="both GPUs' readings stored")
        assert Job.objects.get(pk=on_gpus.pk).current_attempt.gpu_samples >= 2
    finally:
        loop.stop()
        loop.join(10)


def test_a_read_left_from_before_a_pause_is_not_stored(settings, submit):
    settings.JOBSITE_GPU_METRICS_URL, settings.JOBSITE_GPU_SAMPLE_SECONDS = "", 10.0
    job = running_on(submit, [0, 1])
    sampler = NvmlSampler(node="local", nvml=FakeNvml())
    step._state.update(key=("local", ""), scrapes=step.Scrapes(sampler), next=time.monotonic() + 3600)
    step._state["scrapes"].done = (timezone.now() - timedelta(minutes=10), sampler.read())
    step.telemetry_tick(LOCAL)
    assert not GpuSeries.objects.exists()
    step._state["scrapes"].done = (timezone.now(), sampler.read())
    step.telemetry_tick(LOCAL)
    assert GpuSeries.objects.filter(attempt=job.current_attempt).count() == 2
