"""The scheduler's telemetry tick: scrapes the configured exporter over HTTP at most every
JOBSITE_GPU_SAMPLE_SECONDS, and a garbled or unreachable scrape changes nothing and stops nothing."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from jobs import services
from jobs.choices import Phase
from jobs.models import GpuSeries
from scheduler.telemetry import step
from tests.waiting import wait_for

from .fake_nvml import FIXTURES

pytestmark = pytest.mark.django_db
KUBERNETES = SimpleNamespace(name="kubernetes")


@pytest.fixture
def exporter():
    body = {"text": "", "requests": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body["requests"] += 1
            data = body["text"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield body, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    monkeypatch.setattr(step, "_state", step.fresh_state())


def test_tick_scrapes_once_per_interval_and_survives_a_garbled_scrape(submit, settings, exporter):
    body, url = exporter
    settings.JOBSITE_GPU_METRICS_URL, settings.JOBSITE_GPU_SAMPLE_SECONDS = url, 3600
    settings.JOBSITE_K8S_NAMESPACE = "jobsite"
    job = submit("bob", "gpu-2")
    services.job_transition(job=job, phase=Phase.PENDING)
    services.job_admit(job=job, backend="kubernetes", placement=[{"node": "gpu-node-a"}])
    services.job_transition(job=job, phase=Phase.RUNNING)
    body["text"] = (FIXTURES / "dcgm_scrape.txt").read_text().replace('pod="job-12-1-', f'pod="job-{job.pk}-1-')

    step.telemetry_tick(KUBERNETES)  # starts a read in its own thread; a later round stores it
    wait_for(lambda: step.telemetry_tick(KUBERNETES) or GpuSeries.objects.exists(), timeout=30,
             message="the scrape stored by a later round")
    step.telemetry_tick(KUBERNETES)  # within the interval: no second scrape
    assert sorted(len(s.points) for s in GpuSeries.objects.filter(resolution=10)) == [1, 1]
    assert body["requests"] == 1

    step._state["next"] = 0.0
    body["text"] = 'DCGM_FI_DEV_GPU_UTIL{gpu="0" 12\n'  # garbled
    step.telemetry_tick(KUBERNETES)
    wait_for(lambda: body["requests"] == 2 and not step._state["scrapes"].thread.is_alive(), timeout=30,
             message="the garbled scrape read")
    step.telemetry_tick(KUBERNETES)  # logged, not raised
    assert sorted(len(s.points) for s in GpuSeries.objects.filter(resolution=10)) == [1, 1]


@pytest.mark.fast
def test_no_sampler_without_a_url_on_kubernetes(settings):
    settings.JOBSITE_GPU_METRICS_URL = ""
    assert step.sampler_for("kubernetes") is None
    assert step.sampler_for("local").source == "nvml"
