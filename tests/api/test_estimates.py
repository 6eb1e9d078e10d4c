"""The estimated start of pending jobs in the API: the job (list and detail), the group's queue, the schema."""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from scheduler.estimate import step_time
from scheduler.passes import schedule_pass

from .conftest import JOBS_URL, group_url, job_url

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("estimates_each_pass")]


def test_a_pending_job_shows_its_estimated_start_and_basis(world, submit, client_for):
    t0 = timezone.now().replace(microsecond=0)
    holder = submit("bob", "gpu-4", name="holder", active_deadline_seconds=2 * 3600)
    schedule_pass(now=t0)
    waiter = submit("pan", "gpu-1", name="waiter")
    schedule_pass(now=t0)
    expected = step_time(t0, t0 + timedelta(hours=2))
    client = client_for("pan")

    detail = client.get(job_url(waiter.pk)).json()
    assert datetime.fromisoformat(detail["estimated_start"]) == expected
    assert detail["estimate_basis"] == "deadlines"
    listed = {j["id"]: j for j in client.get(JOBS_URL).json()["results"]}
    assert datetime.fromisoformat(listed[waiter.pk]["estimated_start"]) == expected
    assert (listed[holder.pk]["estimated_start"], listed[holder.pk]["estimate_basis"]) == (None, "")

    [row] = client.get(group_url("phusers", "queue")).json()["results"]
    assert datetime.fromisoformat(row["estimated_start"]) == expected and row["estimate_basis"] == "deadlines"


def test_the_schema_documents_the_estimate(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    for name in ("Job", "JobDetail", "QueueEntry"):
        props = schema["components"]["schemas"][name]["properties"]
        assert props["estimated_start"]["format"] == "date-time" and props["estimated_start"]["nullable"] is True
        assert "history" in props["estimate_basis"]["description"]
