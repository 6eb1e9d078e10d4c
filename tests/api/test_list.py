"""GET /api/v1/jobs/: visible jobs only, newest first, paginated, filtered, in a fixed number of queries."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.choices import Phase
from jobs.models import Job
from scheduler.passes import schedule_pass

from .conftest import JOBS_URL


def ids(response):
    return [j["id"] for j in response.json()["results"]]


@pytest.mark.django_db
def test_list_shows_visible_jobs_newest_first(world, submit, client_for):
    a = submit("bob")
    b = submit("lin", group="research")
    c = submit("pan")
    o = submit("eve", group="other")

    bob = client_for("bob").get(JOBS_URL).json()
    assert bob["count"] == 2
    assert [j["id"] for j in bob["results"]] == [c.pk, a.pk]
    assert ids(client_for("lin").get(JOBS_URL)) == [c.pk, b.pk, a.pk]
    assert ids(client_for("eve").get(JOBS_URL)) == [o.pk]
    assert ids(client_for("admin").get(JOBS_URL)) == [o.pk, c.pk, b.pk, a.pk]

    item = bob["results"][0]
    assert (item["user"], item["group"], item["priority"], item["phase"]) == ("pan", "phusers", "normal", "SUBMITTED")
    assert "events" not in item and "attempts" not in item


@pytest.mark.django_db
def test_pagination(world, submit, client_for):
    jobs = [submit("bob", name=f"j{i}") for i in range(5)]
    client = client_for("bob")

    first = client.get(JOBS_URL, {"page_size": 2}).json()
    assert first["count"] == 5
    assert first["previous"] is None
    assert [j["id"] for j in first["results"]] == [jobs[4].pk, jobs[3].pk]
    assert "page=2" in first["next"] and "page_size=2" in first["next"]

    second = client.get(first["next"]).json()
    assert [j["id"] for j in second["results"]] == [jobs[2].pk, jobs[1].pk]
    third = client.get(second["next"]).json()
    assert [j["id"] for j in third["results"]] == [jobs[0].pk]
    assert third["next"] is None
    assert third["previous"]

    assert client.get(JOBS_URL, {"page": 9, "page_size": 2}).status_code == 404


@pytest.mark.django_db
def test_page_size_is_capped_at_500(world, client_for):
    job = Job.objects.create(
        name="seed", group=world.groups["phusers"], user=world.users["bob"], image=world.image,
        instance_type=world.types["cpu-tiny"], command="true", queued_at="2024-01-01T00:00:00Z",
    )
    Job.objects.bulk_create([Job(**{f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields
                                    if f.attname != "id"}) for _ in range(520)])
    response = client_for("bob").get(JOBS_URL, {"page_size": 10_000}).json()
    assert response["count"] == 521
    assert len(response["results"]) == 500
    assert response["next"]


@pytest.mark.django_db
def test_filters(world, submit, client_for):
    a = submit("bob", "gpu-2", name="A")
    b = submit("pan", "gpu-4", name="B")
    c = submit("lin", "gpu-2", name="C")
    r = submit("lin", "gpu-1", group="research", name="R")
    schedule_pass()  # A and R admitted; B and C pending
    client = client_for("lin")

    assert ids(client.get(JOBS_URL, {"group": "research"})) == [r.pk]
    assert ids(client.get(JOBS_URL, {"group": "phusers"})) == [c.pk, b.pk, a.pk]
    assert ids(client.get(JOBS_URL, {"phase": "PENDING"})) == [c.pk, b.pk]
    assert ids(client.get(JOBS_URL + "?phase=PREPARING&phase=PENDING")) == [r.pk, c.pk, b.pk, a.pk]
    assert ids(client.get(JOBS_URL, {"phase": "PREPARING", "group": "phusers"})) == [a.pk]
    assert ids(client.get(JOBS_URL, {"user": "lin"})) == [r.pk, c.pk]
    assert ids(client.get(JOBS_URL, {"user": "pan", "phase": "PENDING"})) == [b.pk]
    assert ids(client.get(JOBS_URL, {"group": "other"})) == []  # filters never widen visibility
    assert ids(client_for("bob").get(JOBS_URL, {"group": "research"})) == []

    bad = client.get(JOBS_URL, {"phase": "SLEEPING"})
    assert bad.status_code == 400
    assert "phase" in bad.json()
    assert Job.objects.get(pk=a.pk).phase == Phase.PREPARING


@pytest.mark.django_db
def test_list_has_no_n_plus_1(world, submit, client_for, django_assert_max_num_queries):
    for i in range(60):
        submit(["bob", "pan", "lin"][i % 3], ["cpu-tiny", "gpu-1"][i % 2])
    schedule_pass()  # some jobs get a current attempt
    assert Job.objects.exclude(current_attempt=None).exists()
    client = client_for("bob")

    with django_assert_max_num_queries(4):  # token+user, count, page
        response = client.get(JOBS_URL, {"page_size": 100})
    assert len(response.json()["results"]) == 60

    with CaptureQueriesContext(connection) as few:
        client.get(JOBS_URL, {"page_size": 2})
    with CaptureQueriesContext(connection) as many:
        client.get(JOBS_URL, {"page_size": 100})
    assert len(few) == len(many)
