"""``after`` on POST /api/v1/jobs/: a job waits for others (jobs or arrays); the detail shows what it waits for
(``after``) and which jobs wait for it (``waited_by``); a bad ``after`` is a 400 on that field and writes nothing."""

from __future__ import annotations

import pytest

from jobs import services
from jobs.choices import Phase
from jobs.models import Job, JobArray, JobDependency, JobEvent

from .conftest import JOBS_URL, assert_error_shape, job_url

pytestmark = [pytest.mark.fast, pytest.mark.django_db]

GOOD = {"group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny", "command": "python eval.py"}


def post(client, **body):
    return client.post(JOBS_URL, {**GOOD, **body}, format="json")


def failed(job: Job) -> Job:
    for phase in (Phase.PENDING, Phase.PREPARING, Phase.RUNNING, Phase.FAILED):
        services.job_transition(job=job, phase=phase, reason="Error" if phase == Phase.FAILED else "")
    return job


def test_a_job_submitted_after_another_waits_and_both_details_say_so(world, submit, client_for):
    a = submit("bob", name="train")
    bob = client_for("bob")

    response = post(bob, name="evaluate", after=[{"job": a.pk}])

    assert response.status_code == 201, response.json()
    data = response.json()
    assert (data["phase"], data["reason"]) == ("PENDING", "Dependency")
    assert data["message"] == f"Waits for job {a.pk} to succeed"
    assert data["after"] == [{"job": a.pk, "when": "ok", "satisfied": False}]
    assert data["waited_by"] == []
    assert bob.get(job_url(data["id"])).json() == data  # the answer is the detail
    assert bob.get(job_url(a.pk)).json()["waited_by"] == [data["id"]]
    assert Job.objects.get(pk=data["id"]).dependency_wait


def test_an_array_target_and_a_met_dependency(world, submit, client_for):
    array = JobArray.objects.create(name="sweep", group=world.groups["phusers"], user=world.users["bob"], size=0)
    a = failed(submit("bob"))

    response = post(client_for("pan"), after=[{"array": array.pk, "when": "any"}, {"job": a.pk, "when": "notok"}])

    assert response.status_code == 201, response.json()
    data = response.json()
    # An array without members has ended: both met, nothing to wait for.
    assert data["after"] == [{"array": array.pk, "when": "any", "satisfied": True},
                             {"job": a.pk, "when": "notok", "satisfied": True}]
    assert data["phase"] == "SUBMITTED"


def test_waited_by_lists_only_the_jobs_the_caller_may_see(world, submit, client_for):
    a = submit("lin", group="phusers")
    theirs = client_for("lin").post(JOBS_URL, {**GOOD, "group": "research", "after": [{"job": a.pk}]},
                                    format="json").json()["id"]
    ours = post(client_for("pan"), after=[{"job": a.pk, "when": "any"}]).json()["id"]

    assert client_for("bob").get(job_url(a.pk)).json()["waited_by"] == [ours]  # bob is not in research
    assert client_for("admin").get(job_url(a.pk)).json()["waited_by"] == [theirs, ours]


BAD = [
    ("not a list", lambda ids: {"job": ids["a"]}, "after"),
    ("an item not an object", lambda ids: [ids["a"]], "after.0"),
    ("an unknown job", lambda ids: [{"job": 987654}], "after"),
    ("a job of another group", lambda ids: [{"job": ids["eve"]}], "after"),
    ("an unknown array", lambda ids: [{"array": 987654}], "after"),
    ("a bad when", lambda ids: [{"job": ids["a"], "when": "afterok"}], "after"),
    ("a duplicate", lambda ids: [{"job": ids["a"]}, {"job": ids["a"]}], "after"),
    ("a string id", lambda ids: [{"job": str(ids["a"])}], "after"),
    ("never: afterok on a failed job", lambda ids: [{"job": ids["failed"]}], "after"),
]


@pytest.mark.parametrize("after, field", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_after_is_a_400_on_the_field_and_writes_nothing(world, submit, client_for, after, field):
    ids = {"a": submit("bob").pk, "eve": submit("eve", group="other").pk, "failed": failed(submit("bob")).pk}
    jobs, events = Job.objects.count(), JobEvent.objects.count()

    response = post(client_for("bob"), after=after(ids))

    assert_error_shape(response, 400, field)
    assert (Job.objects.count(), JobEvent.objects.count()) == (jobs, events)
    assert not JobDependency.objects.exists()


def test_the_never_message_says_why(world, submit, client_for):
    a = failed(submit("bob"))
    data = assert_error_shape(post(client_for("bob"), after=[{"job": a.pk}]), 400, "after")
    assert data["errors"]["after"] == [f"job {a.pk} has already failed; it can never succeed."]


def test_a_cycle_is_refused_with_a_field_error(world, submit, client_for):
    x, y = submit("bob"), submit("bob")
    JobDependency.objects.create(job=x, on_job=y)  # a cycle no submit can make, written directly
    JobDependency.objects.create(job=y, on_job=x)
    jobs = Job.objects.count()

    data = assert_error_shape(post(client_for("bob"), after=[{"job": y.pk, "when": "any"}]), 400, "after")

    assert data["errors"]["after"] == [
        f"These dependencies would make a cycle: job {y.pk} waits for job {x.pk} waits for job {y.pk}."]
    assert Job.objects.count() == jobs


@pytest.mark.slow  # the schema's generation runs a process
def test_the_schema_documents_after_and_waited_by(client):
    schemas = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()["components"]["schemas"]
    after = schemas["JobSubmitRequest"]["properties"]["after"]
    assert after["type"] == "array" and "afterok" in after["description"]
    detail = schemas["JobDetail"]["properties"]
    assert detail["after"]["items"]["$ref"].endswith("/Dependency")
    assert detail["waited_by"]["items"]["type"] == "integer"
