"""GET /api/v1/jobs/{id}/: every field of a job, its attempts and its events."""

import pytest

from jobs.models import Attempt, Job
from scheduler.passes import schedule_pass

from .conftest import job_url

FIELDS = {
    "id", "name", "group", "user", "image", "instance_type", "command", "env", "replicas", "job_type", "priority",
    "preemptible", "backoff_limit", "active_deadline_seconds", "ttl_seconds_after_finished", "request", "phase",
    "status", "color", "color_name", "reason", "message", "exit_code", "queue_position", "over_quota", "created_at",
    "admitted_at", "started_at", "finished_at", "current_attempt", "attempts", "events", "estimated_start",
    "estimate_basis", "after", "waited_by", "ports",
}


@pytest.mark.django_db
def test_detail_of_an_admitted_job(world, submit, client_for, django_assert_max_num_queries):
    job = submit("bob", "gpu-2", name="A", env={"X": "1"}, replicas=2)
    schedule_pass()
    client = client_for("pan")

    with django_assert_max_num_queries(5):  # token+user, job, attempts, events, dependencies both ways
        response = client.get(job_url(job.pk))
    assert response.status_code == 200
    data = response.json()
    assert set(data) == FIELDS
    assert data["name"] == "A"
    assert data["env"] == {"X": "1"}
    assert data["replicas"] == 2
    assert data["request"] == {"gpu": 2, "cpu": 16000, "memory": 64 << 30}
    assert data["phase"] == "PREPARING"
    assert data["status"] == "ContainerCreating"
    assert (data["color"], data["color_name"]) == ("#599b3e", "green")
    assert data["current_attempt"] == 1
    assert data["admitted_at"] and data["created_at"]
    assert data["finished_at"] is None
    assert data["queue_position"] is None
    assert (data["estimated_start"], data["estimate_basis"]) == (None, "")

    attempt = Attempt.objects.get(job=job)
    [shown] = data["attempts"]
    assert set(shown) == {"number", "node", "started_at", "running_at", "ended_at", "exit_code", "failed_rank",
                          "outcome", "gpu_seconds"}
    assert (shown["number"], shown["node"], shown["ended_at"]) == (1, attempt.node, None)

    reasons = [e["reason"] for e in data["events"]]
    assert (reasons[0], reasons[-1]) == ("Submitted", "Admitted")
    submitted, admitted = data["events"][0], data["events"][-1]
    assert set(submitted) == {"time", "type", "reason", "message", "attempt"}
    assert (submitted["type"], submitted["attempt"]) == ("Normal", None)
    assert admitted["attempt"] == 1
    assert "bob" in submitted["message"]


@pytest.mark.django_db
@pytest.mark.parametrize("pk", ["abc", "0", "99999999", str(2**70)])
def test_detail_of_no_job_is_404(world, client_for, pk):
    response = client_for("admin").get(f"/api/v1/jobs/{pk}/")
    assert response.status_code == 404
    assert response.json()["detail"]


@pytest.mark.django_db
def test_unsupported_methods(world, submit, client_for):
    job = submit("bob")
    client = client_for("bob")
    assert client.delete(job_url(job.pk)).status_code == 405
    assert client.patch(job_url(job.pk), {"name": "x"}, format="json").status_code == 405
    assert client.get(job_url(job.pk, "cancel")).status_code == 405
    assert Job.objects.get(pk=job.pk).name == job.name


@pytest.mark.django_db
def test_browsable_api_renders(world, submit, client):
    job = submit("bob")
    client.force_login(world.users["bob"])
    for url in ("/api/v1/jobs/", job_url(job.pk)):
        response = client.get(url, HTTP_ACCEPT="text/html")
        assert response.status_code == 200
        assert response["Content-Type"].startswith("text/html")
