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
    assert "phase" in bad.json()["errors"]
    assert Job.objects.get(pk=a.pk).phase == Phase.PREPARING


@pytest.mark.django_db
def test_list_has_no_n_plus_1(world, submit, client_for, django_assert_max_num_queries):
    for i in range(60):
        submit(["bob", "pan", "lin"][i % 3], ["cpu-tiny", "gpu-1"][i % 2])
    schedule_pass()  # some jobs get a current attempt
    assert Job.objects.exclude(current_attempt=None).exists()
    client = client_for("bob")

    with django_assert_max_num_queries(5):  # token+user, the user's groups, count, page, queue positions
        response = client.get(JOBS_URL, {"page_size": 100})
    assert len(response.json()["results"]) == 60

    with CaptureQueriesContext(connection) as few:
        client.get(JOBS_URL, {"page_size": 2})
    with CaptureQueriesContext(connection) as many:
        client.get(JOBS_URL, {"page_size": 40})  # (a list that fits on one page is counted as it is read)
    assert len(few) == len(many)


# --- more filters, search and vocabularies ------------------------------------------------------------------


@pytest.mark.django_db
def test_status_type_created_and_search_filters(world, submit, client_for):
    from datetime import timedelta

    from django.utils import timezone

    from jobs import services

    a = submit("bob", "gpu-1", name="resnet-50")
    b = submit("bob", name="bert-base", job_type="interactive")
    c = submit("pan", name="ResNet-101")
    services.job_cancel(job=c, by=world.users["pan"], stop=True)
    Job.objects.filter(pk=a.pk).update(created_at=timezone.now() - timedelta(days=3))
    client = client_for("bob")

    assert ids(client.get(JOBS_URL, {"status": "Stopped"})) == [c.pk]
    assert ids(client.get(JOBS_URL, {"status": "Stopped,Submitted"})) == [c.pk, b.pk, a.pk]
    assert ids(client.get(JOBS_URL, {"job_type": "interactive"})) == [b.pk]
    assert ids(client.get(JOBS_URL, {"q": "resnet"})) == [c.pk, a.pk]
    assert ids(client.get(JOBS_URL, {"q": str(b.pk)})) == [b.pk]
    assert ids(client.get(JOBS_URL, {"q": f"#{b.pk}"})) == [b.pk]
    yesterday = (timezone.now() - timedelta(days=1)).isoformat()
    assert ids(client.get(JOBS_URL, {"created_after": yesterday})) == [c.pk, b.pk]
    assert ids(client.get(JOBS_URL, {"created_before": yesterday})) == [a.pk]
    today = timezone.localdate().isoformat()
    assert ids(client.get(JOBS_URL, {"created_after": today, "user": "bob"})) == [b.pk]

    for params in ({"job_type": "batch"}, {"created_after": "soon"}, {"q": "x" * 200}, {"q": "a\x00b"}):
        response = client.get(JOBS_URL, params)
        assert response.status_code == 400, params
        assert set(response.json()["errors"]) == set(params)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "vocabulary,status,code",
    [("mcli", "PENDING", None), ("kueue", "Submitted", None), ("jobq", "Submitted", None),
     ("runai", "Pending", None), ("primehub", "pending", None), ("modelarts", "JOBSTAT_SUBMIT_TRYING", 4),
     ("MCLI", "PENDING", None)],
)
def test_vocabulary_on_list_and_detail(world, submit, client_for, vocabulary, status, code):
    job = submit("bob")
    client = client_for("bob")
    for item in (client.get(JOBS_URL, {"vocabulary": vocabulary}).json()["results"][0],
                 client.get(f"{JOBS_URL}{job.pk}/", {"vocabulary": vocabulary}).json()):
        assert item["vocabulary_status"] == status
        assert item.get("vocabulary_code") == code
        assert ("vocabulary_code" in item) == (code is not None)
        assert item["status"] == "Submitted"


@pytest.mark.django_db
def test_no_vocabulary_no_fields_and_unknown_is_400(world, submit, client_for):
    job = submit("bob")
    client = client_for("bob")
    item = client.get(f"{JOBS_URL}{job.pk}/").json()
    assert "vocabulary_status" not in item and "vocabulary_code" not in item
    for url in (JOBS_URL, f"{JOBS_URL}{job.pk}/"):
        response = client.get(url, {"vocabulary": "slurm"})
        assert response.status_code == 400
        assert "slurm" in response.json()["errors"]["vocabulary"][0]


@pytest.mark.django_db
def test_vocabulary_follows_the_job_through_its_life(world, submit, client_for):
    job = submit("bob", "gpu-1")
    schedule_pass()
    client = client_for("bob")

    def shown(vocabulary):
        data = client.get(f"{JOBS_URL}{job.pk}/", {"vocabulary": vocabulary}).json()
        return data["vocabulary_status"], data.get("vocabulary_code")

    assert shown("mcli") == ("STARTING", None)
    assert shown("modelarts") == ("JOBSTAT_INIT", 1)
    client.post(f"{JOBS_URL}{job.pk}/cancel/")
    assert shown("mcli") == ("TERMINATING", None)
    assert shown("modelarts") == ("JOBSTAT_KILLING", 9)
    assert shown("primehub") == ("running", None)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "value,status",
    [("2904-08-12T11:17:36+21:21", 200), ("2024-01-01T00:00:00-23:59", 200), ("9999-12-31T23:59:59-23:59", 400),
     ("0001-01-01T00:00:00+01:00", 400), ("2024-01-01", 200)],
)
def test_created_filters_take_any_offset(world, client_for, value, status):
    """Found by schemathesis: offsets beyond PostgreSQL's ±15:59 were a 500."""
    for name in ("created_after", "created_before"):
        response = client_for("bob").get(JOBS_URL, {name: value})
        assert response.status_code == status, response.json()
