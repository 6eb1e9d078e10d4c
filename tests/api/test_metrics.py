"""The web app's /metrics (jobs/metrics.py: the default REGISTRY plus database gauges, token-protected when
configured) and /healthz (jobs/health.py); and that jobs/ reaches no scheduler module through them."""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import OperationalError
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from jobs import health as jobs_health
from jobs.choices import Phase
from jobs.metrics import job_figures
from jobs.models import Job

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _embedded(settings):
    """The scrapes read /metrics as the embedded default serves it (open while no token is set); the tests run on
    PostgreSQL and Redis, which is production, whose rule has tests of its own (``test_production_*``)."""
    settings.JOBSITE_PRODUCTION = False
    settings.JOBSITE_METRICS_PUBLIC = False


def scrape(client, **headers) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


@pytest.fixture
def jobs(submit):
    """phusers: SUBMITTED 100 s, PENDING 50 s, RUNNING 2×2 GPUs; research: INADMISSIBLE 3600 s, SUCCEEDED,
    PREPARING 1 GPU; other: nothing."""
    now = timezone.now()

    def make(user, group, phase, waited, instance_type="cpu-tiny", **spec):
        job = submit(user, instance_type, group=group, **spec)
        Job.objects.filter(pk=job.pk).update(phase=phase, queued_at=now - timedelta(seconds=waited))
        return job

    make("bob", "phusers", Phase.SUBMITTED, 100)
    make("pan", "phusers", Phase.PENDING, 50)
    make("bob", "phusers", Phase.RUNNING, 500, "gpu-2", replicas=2)
    make("lin", "research", Phase.INADMISSIBLE, 3600)
    make("lin", "research", Phase.SUCCEEDED, 7200)
    make("lin", "research", Phase.PREPARING, 10, "gpu-1")
    return now


def test_job_figures(jobs):
    figures = job_figures(now=jobs)
    assert figures.jobs_by_phase == {**dict.fromkeys(Phase.values, 0), "SUBMITTED": 1, "PENDING": 1, "RUNNING": 1,
                                     "INADMISSIBLE": 1, "SUCCEEDED": 1, "PREPARING": 1}
    assert {name: q.length for name, q in figures.queues.items()} == {"phusers": 2, "research": 1, "other": 0}
    assert figures.oldest_wait_seconds("phusers") == 100.0
    assert figures.oldest_wait_seconds("research") == 3600.0
    assert figures.oldest_wait_seconds("other") == 0.0
    assert figures.gpus_held == {"phusers": 4, "research": 1, "other": 0}


def test_job_figures_cost_a_few_queries(jobs, django_assert_max_num_queries):
    with django_assert_max_num_queries(4):
        job_figures()


def test_scrape_reports_database_gauges(jobs, client):
    m = scrape(client)
    assert m[("jobsite_database_up", ())] == 1
    assert m[("jobsite_jobs", (("phase", "SUBMITTED"),))] == 1
    assert m[("jobsite_jobs", (("phase", "RUNNING"),))] == 1
    assert m[("jobsite_jobs", (("phase", "FAILED"),))] == 0
    assert sum(v for (name, _), v in m.items() if name == "jobsite_jobs") == 6
    assert m[("jobsite_queue_length", (("group", "phusers"),))] == 2
    assert m[("jobsite_queue_length", (("group", "research"),))] == 1
    assert m[("jobsite_queue_length", (("group", "other"),))] == 0
    assert 100 <= m[("jobsite_queue_oldest_wait_seconds", (("group", "phusers"),))] < 160
    assert 3600 <= m[("jobsite_queue_oldest_wait_seconds", (("group", "research"),))] < 3660
    assert m[("jobsite_queue_oldest_wait_seconds", (("group", "other"),))] == 0
    assert m[("jobsite_gpus_held", (("group", "phusers"),))] == 4
    assert m[("jobsite_gpus_held", (("group", "research"),))] == 1


def test_scrape_includes_the_process_registry(world, client):
    """In the embedded single process the scheduler's metrics, in the default REGISTRY, are served here too."""
    from scheduler import metrics

    metrics.PASS_SECONDS.observe(0.1)
    m = scrape(client)
    assert m[("jobsite_scheduler_pass_seconds_count", ())] >= 1
    assert ("jobsite_database_up", ()) in m


def test_database_gauges_stay_out_of_the_default_registry(world, client):
    from prometheus_client import REGISTRY

    scrape(client)
    assert REGISTRY.get_sample_value("jobsite_database_up") is None
    assert REGISTRY.get_sample_value("jobsite_queue_length", {"group": "phusers"}) is None


def test_scrape_survives_a_database_failure(world, client, monkeypatch):
    def down(now=None):
        raise OperationalError("connection refused")

    monkeypatch.setattr("jobs.metrics.job_figures", down)
    m = scrape(client)
    assert m[("jobsite_database_up", ())] == 0
    assert not any(name == "jobsite_queue_length" for name, _ in m)


def test_open_without_token(world, client, settings):
    settings.JOBSITE_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 200


def test_token_required_when_set(world, client, settings):
    settings.JOBSITE_METRICS_TOKEN = "s3cret-token"
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token s3cret-token").status_code == 401
    assert ("jobsite_database_up", ()) in scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-token")
    client.force_login(world.users["bob"])
    assert client.get("/metrics").status_code == 403  # a session, but not staff
    client.force_login(world.users["admin"])
    assert client.get("/metrics").status_code == 200  # staff session


def test_production_without_a_token_refuses_every_scrape_and_says_why(world, client, settings):
    settings.JOBSITE_PRODUCTION, settings.JOBSITE_METRICS_TOKEN = True, ""
    response = client.get("/metrics")
    assert response.status_code == 403
    assert b"JOBSITE_METRICS_TOKEN" in response.content and b"JOBSITE_METRICS_PUBLIC" in response.content
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 403  # an empty token is no token
    client.force_login(world.users["bob"])
    assert client.get("/metrics").status_code == 403
    client.force_login(world.users["admin"])
    assert client.get("/metrics").status_code == 200  # staff sessions may always read it


def test_production_with_a_token_wants_it(world, client, settings):
    settings.JOBSITE_PRODUCTION, settings.JOBSITE_METRICS_TOKEN = True, "prod-token"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert ("jobsite_database_up", ()) in scrape(client, HTTP_AUTHORIZATION="Bearer prod-token")


def test_production_opened_explicitly(world, client, settings):
    settings.JOBSITE_PRODUCTION, settings.JOBSITE_METRICS_TOKEN = True, ""
    settings.JOBSITE_METRICS_PUBLIC = True
    assert ("jobsite_database_up", ()) in scrape(client)


def test_the_start_says_who_may_read_metrics(settings):
    from jobsite.security import metrics_access_summary

    settings.JOBSITE_PRODUCTION, settings.JOBSITE_METRICS_TOKEN = True, ""
    level, text = metrics_access_summary()
    assert level == logging.WARNING and "closed" in text and "JOBSITE_METRICS_TOKEN" in text
    settings.JOBSITE_METRICS_PUBLIC = True
    assert "open to anyone" in metrics_access_summary()[1]
    settings.JOBSITE_METRICS_PUBLIC, settings.JOBSITE_METRICS_TOKEN = False, "t"
    assert metrics_access_summary() == (logging.INFO, "/metrics needs its bearer token (JOBSITE_METRICS_TOKEN)")


def test_only_get_and_head(world, client):
    assert client.post("/metrics").status_code == 405
    assert client.head("/metrics").status_code == 200


def test_healthz_ok_without_login_or_session(db, client):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.content == b"ok"
    assert "sessionid" not in response.cookies
    assert "no-cache" in response["Cache-Control"]


def test_healthz_503_when_the_database_fails(db, client, monkeypatch):
    class DownConnection:
        def cursor(self):
            raise OperationalError("connection refused")

    monkeypatch.setattr(jobs_health, "connection", DownConnection())
    response = client.get("/healthz")
    assert response.status_code == 503


def _scheduler_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return [n for n in names if n == "scheduler" or n.startswith("scheduler.")]


@pytest.mark.parametrize("module", ["metrics.py", "health.py"])
def test_jobs_metrics_and_health_never_import_the_scheduler(module):
    assert _scheduler_imports(ROOT / "jobs" / module) == []


def test_importing_jobs_metrics_and_health_pulls_in_no_scheduler_module():
    code = (
        "import sys, django\n"
        "django.setup()\n"
        "before = set(sys.modules)\n"
        "import jobs.metrics, jobs.health\n"
        "new = sorted(m for m in set(sys.modules) - before if m.split('.')[0] == 'scheduler')\n"
        "print(new)\n"
        "sys.exit(1 if new else 0)\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "jobsite.settings"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_healthz_answers_a_probe_at_the_pod_ip_over_plain_http(db, client, settings):
    settings.ALLOWED_HOSTS = ["jobsite.example.com"]
    settings.SECURE_SSL_REDIRECT = True
    response = client.get("/healthz", HTTP_HOST="10.244.1.17:8000")
    assert (response.status_code, response.content) == (200, b"ok")
    assert client.get("/login/", HTTP_HOST="10.244.1.17:8000").status_code == 400  # other paths still checked


def test_a_scraper_at_the_pod_ip_gets_metrics_with_its_token(db, client, settings):
    settings.ALLOWED_HOSTS = ["jobsite.example.com"]
    settings.JOBSITE_METRICS_TOKEN = "s3cret"
    ok = client.get("/metrics", HTTP_HOST="10.244.1.17:8000", HTTP_AUTHORIZATION="Bearer s3cret")
    assert ok.status_code == 200 and b"jobsite_jobs" in ok.content
    assert client.get("/metrics", HTTP_HOST="10.244.1.17:8000", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
