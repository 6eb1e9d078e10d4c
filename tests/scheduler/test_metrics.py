"""The scheduler's metrics (scheduler/metrics.py), its liveness state (scheduler/health.py) and its HTTP server
(scheduler/http.py), served on an ephemeral port. No database, no sleeping: the health clock is replaced."""

from __future__ import annotations

import gc
import json
import threading
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduler import health, metrics
from scheduler.http import start_http_server

pytestmark = pytest.mark.fast


def sample(name: str, **labels) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


@pytest.fixture
def clock(monkeypatch):
    """The health module's monotonic clock, moved by hand: clock.t += 61."""

    class Clock:
        t = 1000.0

    c = Clock()
    monkeypatch.setattr(health, "_now", lambda: c.t)
    return c


@pytest.fixture(autouse=True)
def _clean_sources():
    health.reset()
    metrics.register_pods_source(None)
    yield
    health.reset()
    metrics.register_pods_source(None)
    with metrics._lock:
        metrics._informers.clear()


class FakeInformer:
    def __init__(self, name: str, lag: float | None = 1.5):
        self.name = name
        self.relists, self.errors, self.expired, self.watches, self.resyncs = 3, 1, 2, 7, 4
        self.synced = threading.Event()
        self.synced.set()
        self._lag = lag

    def lag_seconds(self) -> float | None:
        return self._lag


def get(url: str, **headers: str) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.fixture
def server():
    srv = start_http_server(0)
    yield f"http://127.0.0.1:{srv.port}"
    srv.shutdown()


# --- health ------------------------------------------------------------------------------------------------------


def test_health_state(clock):
    assert health.seconds_since_beat() is None and health.seconds_since_start() is None
    assert health.is_leader() is False
    health.started()
    clock.t += 5
    assert health.seconds_since_start() == 5.0 and health.seconds_since_beat() is None
    health.beat()
    clock.t += 2
    assert health.seconds_since_beat() == 2.0
    health.set_leader(True)
    assert health.is_leader() is True


# --- direct observations -----------------------------------------------------------------------------------------


def test_admission_latency_buckets():
    count = sample("jobsite_admission_latency_seconds_count") or 0
    under_30 = sample("jobsite_admission_latency_seconds_bucket", le="30.0") or 0
    under_60 = sample("jobsite_admission_latency_seconds_bucket", le="60.0") or 0
    now = timezone.now()
    metrics.observe_admission(now - timedelta(seconds=45), now)
    metrics.observe_admission(None, now)  # unknown queue time: not observed
    assert sample("jobsite_admission_latency_seconds_count") == count + 1
    assert sample("jobsite_admission_latency_seconds_bucket", le="30.0") == under_30
    assert sample("jobsite_admission_latency_seconds_bucket", le="60.0") == under_60 + 1
    assert sample("jobsite_admission_latency_seconds_bucket", le="0.01") is not None
    assert sample("jobsite_admission_latency_seconds_bucket", le="3600.0") is not None


def test_api_errors_and_calls():
    class ApiError(Exception):
        def __init__(self, status):
            self.status = status

    before = sample("jobsite_k8s_api_errors_total", verb="create_namespaced_pod", code="409") or 0
    metrics.api_error("create_namespaced_pod", 409)
    metrics.api_error("create_namespaced_pod", metrics.api_error_code(ApiError(409)))
    assert sample("jobsite_k8s_api_errors_total", verb="create_namespaced_pod", code="409") == before + 2
    network = sample("jobsite_k8s_api_errors_total", verb="list_namespaced_pod", code="network") or 0
    metrics.api_error("list_namespaced_pod", metrics.api_error_code(ConnectionError()))
    metrics.api_error("list_namespaced_pod", metrics.api_error_code(ApiError(0)))
    assert sample("jobsite_k8s_api_errors_total", verb="list_namespaced_pod", code="network") == network + 2
    calls = sample("jobsite_cluster_api_calls_total", verb="delete_namespaced_pod") or 0
    metrics.api_call("delete_namespaced_pod")
    assert sample("jobsite_cluster_api_calls_total", verb="delete_namespaced_pod") == calls + 1


def test_leader_gauge_only_where_a_loop_runs(clock):
    assert sample("jobsite_scheduler_leader") is None  # a web worker: no scheduler loop here
    health.started()
    assert sample("jobsite_scheduler_leader") == 0.0
    health.set_leader(True)
    health.beat()
    clock.t += 3
    assert sample("jobsite_scheduler_leader") == 1.0
    assert sample("jobsite_scheduler_seconds_since_beat") == 3.0


# --- informers ---------------------------------------------------------------------------------------------------


def test_informer_collector_reports_counts_and_lag():
    pods = FakeInformer("test-pods")
    metrics.register_informer(pods)
    assert sample("jobsite_informer_relists_total", resource="test-pods") == 3
    assert sample("jobsite_informer_errors_total", resource="test-pods") == 1
    assert sample("jobsite_informer_expired_total", resource="test-pods") == 2
    assert sample("jobsite_informer_watches_total", resource="test-pods") == 7
    assert sample("jobsite_informer_resyncs_total", resource="test-pods") == 4
    assert sample("jobsite_informer_lag_seconds", resource="test-pods") == 1.5
    assert sample("jobsite_informer_synced", resource="test-pods") == 1
    pods.relists += 1  # read at scrape time
    pods._lag = None  # no figure: no sample
    assert sample("jobsite_informer_relists_total", resource="test-pods") == 4
    assert sample("jobsite_informer_lag_seconds", resource="test-pods") is None


def test_informers_are_weak_and_latest_of_a_name_wins():
    old = FakeInformer("test-events")
    metrics.register_informer(old)
    new = FakeInformer("test-events")
    new.relists = 1
    metrics.register_informer(new)
    metrics.register_informer(new)  # twice: reported once
    assert sample("jobsite_informer_relists_total", resource="test-events") == 1
    del new
    gc.collect()
    assert sample("jobsite_informer_relists_total", resource="test-events") == 3  # the older one is still alive
    del old
    gc.collect()
    assert sample("jobsite_informer_relists_total", resource="test-events") is None


def test_broken_or_partial_informer_is_skipped():
    class Partial:  # an informer without expired/resyncs/lag_seconds
        name = "test-partial"
        relists = 2
        errors = 0
        watches = 1

    class Broken(FakeInformer):
        def lag_seconds(self):
            raise RuntimeError("gone")

    partial, broken, good = Partial(), Broken("test-broken"), FakeInformer("test-good")
    for informer in (partial, broken, good):
        metrics.register_informer(informer)
    assert sample("jobsite_informer_relists_total", resource="test-partial") == 2
    assert sample("jobsite_informer_expired_total", resource="test-partial") is None
    assert sample("jobsite_informer_lag_seconds", resource="test-broken") is None
    assert sample("jobsite_informer_lag_seconds", resource="test-good") == 1.5


# --- pods --------------------------------------------------------------------------------------------------------


def pod(phase: str | None, deleting: bool = False) -> dict:
    meta = {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {"name": "p"}
    return {"metadata": meta, "status": {"phase": phase} if phase else {}}


def test_pods_gauge_counts_by_phase():
    pods = [pod("Running"), pod("Running", deleting=True), pod("Pending"), pod("Succeeded"), pod(None), pod("Odd")]
    metrics.register_pods_source(lambda: pods)
    assert sample("jobsite_pods", phase="Running") == 2
    assert sample("jobsite_pods", phase="Pending") == 1
    assert sample("jobsite_pods", phase="Succeeded") == 1
    assert sample("jobsite_pods", phase="Failed") == 0
    assert sample("jobsite_pods", phase="Unknown") == 2
    assert sample("jobsite_pods_terminating") == 1
    pods.append(pod("Failed"))
    assert sample("jobsite_pods", phase="Failed") == 1


def test_dead_or_failing_pods_source_is_skipped():
    class Backend:
        def managed_pods(self):
            return [pod("Running")]

    backend = Backend()
    metrics.register_pods_source(backend.managed_pods)  # a bound method: held weakly
    assert sample("jobsite_pods", phase="Running") == 1
    del backend
    gc.collect()
    assert sample("jobsite_pods", phase="Running") is None

    def failing():
        raise ConnectionError("API down")

    errors = sample("jobsite_metrics_source_errors_total", source="pods") or 0
    metrics.register_pods_source(failing)
    metrics.PASS_SECONDS.observe(0.01)
    text = generate_latest(REGISTRY).decode()  # the scrape still works
    assert "jobsite_scheduler_pass_seconds_count" in text and "jobsite_pods{" not in text
    assert sample("jobsite_metrics_source_errors_total", source="pods") > errors

    metrics.register_pods_source(lambda: None)  # "don't know now" (informer not synced)
    assert sample("jobsite_pods", phase="Running") is None


# --- the HTTP server ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_http_metrics(server, settings):
    settings.JOBSITE_METRICS_TOKEN = "sched-token"
    metrics.PASS_SECONDS.observe(0.25)
    metrics.SYNC_SECONDS.observe(0.5)
    status, headers, body = get(server + "/metrics", Authorization="Bearer sched-token")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert {"jobsite_scheduler_pass_seconds", "jobsite_scheduler_sync_seconds",
            "jobsite_admission_latency_seconds"} <= names
    assert b"jobsite_scheduler_pass_seconds_count" in body
    assert get(server + "/nope")[0] == 404


@pytest.mark.slow
def test_http_metrics_needs_its_token_in_production(server, settings):
    settings.JOBSITE_PRODUCTION, settings.JOBSITE_METRICS_TOKEN, settings.JOBSITE_METRICS_PUBLIC = True, "", False
    status, _, body = get(server + "/metrics")
    assert status == 403 and b"JOBSITE_METRICS_TOKEN" in body  # no token set: closed, saying how to open it
    settings.JOBSITE_METRICS_TOKEN = "sched-token"
    status, headers, _ = get(server + "/metrics")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert get(server + "/metrics", Authorization="Bearer wrong")[0] == 401
    assert get(server + "/metrics", Authorization="Bearer sched-token")[0] == 200
    assert get(server + "/healthz")[0] == 200 and get(server + "/readyz")[0] == 200  # probes stay open
    settings.JOBSITE_METRICS_TOKEN, settings.JOBSITE_METRICS_PUBLIC = "", True  # opened explicitly
    assert get(server + "/metrics")[0] == 200


@pytest.mark.slow
def test_http_healthz_follows_the_beat(server, clock, settings):
    settings.JOBSITE_SCHEDULER_INTERVAL = 1.0  # stale after max(30, 10 × 1) = 30 s
    health.started()
    assert get(server + "/healthz")[:3:2] == (200, b"ok")  # starting: no beat yet, in the grace period
    clock.t += 61
    status, _, body = get(server + "/healthz")
    assert status == 503 and b"not finished a round" in body
    health.beat()
    assert get(server + "/healthz")[:3:2] == (200, b"ok")
    clock.t += 31
    assert get(server + "/healthz")[0] == 503
    settings.JOBSITE_SCHEDULER_INTERVAL = 5.0  # stale after 50 s
    assert get(server + "/healthz")[0] == 200
    clock.t += 20
    assert get(server + "/healthz")[0] == 503


@pytest.mark.slow
def test_http_readyz_reports_leadership(server):
    status, headers, body = get(server + "/readyz")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"leader": False}  # a standby is ready too
    health.set_leader(True)
    assert json.loads(get(server + "/readyz")[2]) == {"leader": True}


@pytest.mark.slow
def test_http_server_shutdown_frees_the_port():
    srv = start_http_server(0)
    port = srv.port
    assert get(f"http://127.0.0.1:{port}/readyz")[0] == 200
    srv.shutdown()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2)
