"""Events, attempts, clone, bulk cancel, stop and restart."""

import pytest

from jobs import services
from jobs.choices import Phase, Priority
from jobs.models import Attempt, InstanceType, Job, JobEvent
from scheduler.backend_factory import get_backend
from scheduler.passes import schedule_pass

from .conftest import JOBS_URL, assert_error_shape, job_url

BULK_URL = JOBS_URL + "cancel/"


# --- events and attempts ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_events_oldest_first_paginated(world, submit, client_for):
    job = submit("bob", "gpu-1")
    schedule_pass()
    client = client_for("pan")

    data = client.get(job_url(job.pk, "events")).json()
    assert data["count"] == JobEvent.objects.filter(job=job).count() >= 2
    reasons = [e["reason"] for e in data["results"]]
    assert reasons[0] == "Submitted" and reasons[-1] == "Admitted"
    assert set(data["results"][0]) == {"time", "type", "reason", "message", "attempt"}

    first = client.get(job_url(job.pk, "events"), {"page_size": 1}).json()
    assert first["count"] == data["count"] and len(first["results"]) == 1 and first["next"]


@pytest.mark.django_db
def test_attempts_with_log_sizes(world, submit, client_for):
    job = submit("bob", "gpu-1", replicas=2)
    schedule_pass()
    path = get_backend("local").log_path(job_id=job.pk, attempt_number=1, rank=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"12345")

    data = client_for("bob").get(job_url(job.pk, "attempts")).json()
    assert data["count"] == 1
    [attempt] = data["results"]
    assert (attempt["number"], attempt["replicas"], attempt["gpu"], attempt["backend"]) == (1, 2, 1, "local")
    assert attempt["logs"] == [{"replica": 0, "size": None}, {"replica": 1, "size": 5}]
    assert attempt["ended_at"] is None

    queued = submit("bob", "gpu-4")
    assert client_for("bob").get(job_url(queued.pk, "attempts")).json() == {
        "count": 0, "count_exact": True, "next": None, "previous": None, "results": []}


# --- clone --------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_clone_is_a_new_job_of_the_caller_with_the_same_spec(world, submit, client_for):
    job = submit("bob", "gpu-1", name="orig", env={"A": "1"}, priority=Priority.HIGH, preemptible=True,
                 backoff_limit=2, active_deadline_seconds=600, ttl_seconds_after_finished=60)
    response = client_for("pan").post(job_url(job.pk, "clone"), format="json")

    assert response.status_code == 201, response.json()
    new = Job.objects.get(pk=response.json()["id"])
    assert response["Location"].endswith(job_url(new.pk))
    assert new.pk != job.pk and new.user == world.users["pan"]
    same = ["name", "group_id", "image_id", "instance_type_id", "command", "env", "replicas", "job_type",
            "priority", "preemptible", "backoff_limit", "active_deadline_seconds", "ttl_seconds_after_finished"]
    assert [getattr(new, f) for f in same] == [getattr(job, f) for f in same]
    assert new.phase == Phase.SUBMITTED
    assert [e.reason for e in JobEvent.objects.filter(job=new)] == ["Submitted"]


@pytest.mark.django_db
def test_clone_with_changes(world, submit, client_for):
    job = submit("bob", "gpu-1", name="orig")
    response = client_for("bob").post(job_url(job.pk, "clone"), {"name": "again", "replicas": 2, "env": {"B": 2}},
                                      format="json")
    assert response.status_code == 201, response.json()
    data = response.json()
    assert (data["name"], data["replicas"], data["env"], data["instance_type"]) == ("again", 2, {"B": "2"}, "gpu-1")


@pytest.mark.django_db
def test_clone_is_validated_again(world, submit, client_for):
    job = submit("bob", "gpu-1")
    InstanceType.objects.get(name="gpu-1").groups.remove(world.groups["phusers"])  # no longer allowed
    before = Job.objects.count()
    assert_error_shape(client_for("bob").post(job_url(job.pk, "clone")), 400, "instance_type")
    assert_error_shape(client_for("bob").post(job_url(job.pk, "clone"), {"gpus": 1}, format="json"), 400, "gpus")
    assert_error_shape(client_for("bob").post(job_url(job.pk, "clone"), {"replicas": "x"}, format="json"), 400,
                       "replicas")
    assert Job.objects.count() == before


@pytest.mark.django_db
def test_clone_of_another_groups_job_is_404(world, submit, client_for):
    job = submit("lin", group="research")
    assert_error_shape(client_for("pan").post(job_url(job.pk, "clone")), 404)
    assert client_for("lin").post(job_url(job.pk, "clone")).status_code == 201


@pytest.mark.django_db
def test_clone_as_yaml(world, submit, client_for):
    job = submit("bob", "gpu-1")
    response = client_for("bob").post(job_url(job.pk, "clone"), b"name: from-yaml\n", content_type="text/yaml")
    assert response.status_code == 201, response.json()
    assert response.json()["name"] == "from-yaml"


# --- stop and restart ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_stop_then_restart(world, submit, client_for):
    job = submit("bob")
    bob = client_for("bob")
    data = bob.post(job_url(job.pk, "stop")).json()
    assert (data["phase"], data["status"], data["reason"]) == ("CANCELLED", "Stopped", "StoppedByUser")
    assert_error_shape(bob.post(job_url(job.pk, "stop")), 400)  # already ended

    data = bob.post(job_url(job.pk, "restart")).json()
    assert (data["phase"], data["reason"]) == ("PENDING", "Restarted")
    assert "already" not in data["message"]
    assert_error_shape(bob.post(job_url(job.pk, "restart")), 400)  # still queued


@pytest.mark.django_db
def test_actions_accept_a_vocabulary(world, submit, client_for):
    job = submit("bob")
    data = client_for("bob").post(job_url(job.pk, "cancel") + "?vocabulary=modelarts").json()
    assert (data["vocabulary_status"], data["vocabulary_code"]) == ("JOBSTAT_CANCELED", 13)
    other = submit("bob")
    assert_error_shape(client_for("bob").post(job_url(other.pk, "cancel") + "?vocabulary=slurm"), 400, "vocabulary")
    assert Job.objects.get(pk=other.pk).phase == Phase.SUBMITTED  # a bad parameter changes nothing


# --- bulk cancel --------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_bulk_cancel_reports_each_id(world, submit, client_for):
    running = submit("bob", "gpu-1")
    schedule_pass()
    mine = submit("bob")
    teammates = submit("pan")
    ended = submit("bob")
    services.job_cancel(job=ended, by=world.users["bob"])
    invisible = submit("lin", group="research")
    ids = [mine.pk, running.pk, teammates.pk, ended.pk, invisible.pk, 10**12, mine.pk]

    response = client_for("bob").post(BULK_URL, {"ids": ids}, format="json")

    assert response.status_code == 200
    data = response.json()
    by_id = {r["id"]: r for r in data["results"]}
    assert [r["id"] for r in data["results"]] == ids[:-1]  # repeats done once, in order
    assert (data["ok"], data["cancelled"], data["failed"]) == (False, 2, 4)
    assert (by_id[mine.pk]["status_code"], by_id[mine.pk]["phase"], by_id[mine.pk]["status"]) == (
        200, "CANCELLED", "Cancelled")
    assert (by_id[running.pk]["status_code"], by_id[running.pk]["phase"]) == (200, "TERMINATING")
    assert (by_id[teammates.pk]["status_code"], by_id[teammates.pk]["phase"]) == (403, "SUBMITTED")
    assert by_id[ended.pk]["status_code"] == 400 and "already ended" in by_id[ended.pk]["detail"]
    assert (by_id[invisible.pk]["status_code"], by_id[invisible.pk]["phase"]) == (404, None)
    assert by_id[10**12]["status_code"] == 404
    assert all(r["ok"] == (r["status_code"] == 200) and r["detail"] for r in data["results"])

    assert Job.objects.get(pk=teammates.pk).phase == Phase.SUBMITTED
    assert Job.objects.get(pk=invisible.pk).phase == Phase.SUBMITTED


@pytest.mark.django_db
def test_bulk_stop(world, submit, client_for):
    jobs = [submit("bob") for _ in range(3)]
    data = client_for("bob").post(BULK_URL, {"ids": [j.pk for j in jobs], "stop": True}, format="json").json()
    assert (data["ok"], data["cancelled"]) == (True, 3)
    assert {j.status for j in Job.objects.filter(pk__in=[j.pk for j in jobs])} == {"Stopped"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "payload,field",
    [({}, "ids"), ({"ids": []}, "ids"), ({"ids": "1,2"}, "ids"), ({"ids": [1, "x"]}, "ids.1"),
     ({"ids": [0]}, "ids.0"), ({"ids": list(range(1, 502))}, "ids"), ({"ids": [1], "all": True}, "all"),
     ({"ids": [1], "stop": "maybe"}, "stop"), ({"ids": [2**64]}, "ids.0")],
)
def test_bulk_cancel_bad_bodies(world, submit, client_for, payload, field):
    job = submit("bob")
    assert_error_shape(client_for("bob").post(BULK_URL, payload, format="json"), 400, field)
    assert Job.objects.get(pk=job.pk).phase == Phase.SUBMITTED


@pytest.mark.django_db
def test_bulk_cancel_is_not_a_job_id(world, client_for):
    assert client_for("bob").get(BULK_URL).status_code == 405


@pytest.mark.django_db
def test_attempt_numbers_in_events(world, submit, client_for):
    job = submit("bob", "gpu-1")
    schedule_pass()
    attempt = Attempt.objects.get(job=job)
    events = client_for("bob").get(job_url(job.pk, "events")).json()["results"]
    assert {e["attempt"] for e in events if e["reason"] == "Admitted"} == {attempt.number}
