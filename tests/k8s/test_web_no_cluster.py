"""Only the scheduler talks to the cluster: pages, API, admin and /metrics make no call to the Kubernetes API
(no watch, no list, no delete, nothing), and /utilisation/ works while the cluster's API is down."""

from __future__ import annotations

import pytest

from jobs import services
from jobs.choices import Phase
from scheduler.backend_factory import get_backend
from scheduler.passes import schedule_pass
from scheduler.sync import sync_jobs

from .conftest import NAMESPACE, wait_for

pytestmark = pytest.mark.usefixtures("k8s")


def pages(job) -> list[str]:
    a = job.current_attempt
    return [
        "/", f"/jobs/{job.pk}/", "/jobs/new/", "/groups/phusers/queue/", "/utilisation/", "/usage/",
        f"/jobs/{job.pk}/attempts/{a.number}/replicas/0/log",
        "/api/v1/jobs/", f"/api/v1/jobs/{job.pk}/", f"/api/v1/jobs/{job.pk}/events/",
        f"/api/v1/jobs/{job.pk}/attempts/",
        f"/api/v1/jobs/{job.pk}/logs/?replica=0", f"/api/v1/jobs/{job.pk}/logs/search/?q=hello",
        f"/api/v1/jobs/{job.pk}/logs/raw/", "/api/v1/groups/", "/api/v1/groups/phusers/queue/",
        "/api/v1/utilisation/", "/api/v1/usage/", "/metrics", "/healthz",
        "/admin/", "/admin/jobs/job/", f"/admin/jobs/job/{job.pk}/change/", "/admin/jobs/group/",
    ]


def test_no_page_calls_the_cluster(submit, world, kubelet, k8s, client):
    running = submit("bob", "gpu-1")
    schedule_pass()
    sync_jobs()  # the scheduler's part: launch
    running.refresh_from_db()
    kubelet.running(f"job-{running.pk}-1-0")
    k8s.emu.logs[(NAMESPACE, f"job-{running.pk}-1-0")] = "hello\n"
    wait_for(lambda: sync_jobs() and get_backend().log_path(job_id=running.pk, attempt_number=1, rank=0).exists(),
             timeout=20, what="the scheduler archiving the log")
    submit("pan", "gpu-1")
    services.nodes_record(backend="kubernetes", nodes={"gpu-a": {"gpu": 8, "cpu": 64000, "memory": 1 << 38}})

    k8s.emu.journal.clear()
    from jobs.models import Job

    admin = world.users["bob"]
    admin.is_staff = admin.is_superuser = True
    admin.save()
    client.force_login(admin)
    job = Job.objects.get(pk=running.pk)
    for url in pages(job):
        response = client.get(url)
        assert response.status_code in (200, 302), (url, response.status_code)
        if hasattr(response, "streaming_content"):
            b"".join(response.streaming_content)
    response = client.post(f"/api/v1/jobs/{job.pk}/cancel/", content_type="application/json")
    assert response.status_code == 200
    assert k8s.emu.journal == []  # not one request from the web side
    job.refresh_from_db()
    assert job.phase == Phase.TERMINATING  # the scheduler deletes the pod, not the request


def test_utilisation_shows_the_recorded_nodes_while_the_cluster_api_is_down(submit, world, k8s, client):
    services.nodes_record(backend="kubernetes", nodes={"gpu-a": {"gpu": 8}, "gpu-b": {"gpu": 4}})
    k8s.stop()  # the API server is gone
    client.force_login(world.users["bob"])
    page = client.get("/utilisation/")
    assert page.status_code == 200
    assert b"gpu-a" in page.content and b"gpu-b" in page.content
    data = client.get("/api/v1/utilisation/").json()
    assert data["gpu_total"] == 12
