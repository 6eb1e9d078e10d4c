"""POST /api/v1/jobs/: type checks in the serializer, rules in the submit service, nothing written on error."""

import json

import pytest

from jobs.choices import Phase, Priority
from jobs.models import Image, InstanceType, Job, JobEvent

from .conftest import JOBS_URL, job_url

GOOD = {"group": "phusers", "image": "base-notebook", "instance_type": "gpu-1", "command": "python train.py"}


def post(client, body):
    return client.post(JOBS_URL, body, format="json")


def assert_nothing_written():
    assert Job.objects.count() == 0
    assert JobEvent.objects.count() == 0


@pytest.mark.django_db
def test_submit_happy_path(world, client_for):
    body = {
        **GOOD,
        "name": "resnet",
        "env": {"EPOCHS": "10", "LR": "0.1"},
        "replicas": 2,
        "job_type": "training",
        "priority": "high",
        "preemptible": True,
        "backoff_limit": 3,
        "active_deadline_seconds": 3600,
        "ttl_seconds_after_finished": 60,
    }
    response = post(client_for("bob"), body)

    assert response.status_code == 201, response.json()
    data = response.json()
    job = Job.objects.get()
    assert response["Location"].endswith(job_url(job.pk))
    assert data["id"] == job.pk
    assert (job.phase, job.status, job.user, job.group) == (
        Phase.SUBMITTED, "Submitted", world.users["bob"], world.groups["phusers"]
    )
    assert (job.replicas, job.priority, job.preemptible, job.backoff_limit) == (2, Priority.HIGH, True, 3)
    assert (job.active_deadline_seconds, job.ttl_seconds_after_finished) == (3600, 60)
    assert job.env == {"EPOCHS": "10", "LR": "0.1"}
    assert [e.reason for e in JobEvent.objects.filter(job=job)] == ["Submitted"]

    assert data["name"] == "resnet"
    assert (data["group"], data["user"], data["image"], data["instance_type"]) == (
        "phusers", "bob", "base-notebook", "gpu-1"
    )
    assert data["priority"] == "high"
    assert data["phase"] == "SUBMITTED"
    assert data["status"] == "Submitted"
    assert data["color"] == "#fd8608"
    assert data["color_name"] == "orange"
    assert data["request"] == {"gpu": 1, "cpu": 8000, "memory": 32 << 30}
    assert data["current_attempt"] is None
    assert data["attempts"] == []
    assert [e["reason"] for e in data["events"]] == ["Submitted"]


@pytest.mark.django_db
def test_submit_defaults(world, client_for, settings):
    response = post(client_for("bob"), {**GOOD, "command": "/usr/bin/python3 -m train"})
    assert response.status_code == 201, response.json()
    job = Job.objects.get()
    assert job.name == "python3"
    assert (job.replicas, job.priority, job.preemptible, job.job_type) == (1, Priority.NORMAL, False, "training")
    assert job.backoff_limit == settings.JOBSITE_DEFAULT_BACKOFF_LIMIT
    assert job.active_deadline_seconds == settings.JOBSITE_DEFAULT_ACTIVE_DEADLINE_SECONDS
    assert job.ttl_seconds_after_finished == settings.JOBSITE_DEFAULT_TTL_SECONDS_AFTER_FINISHED
    assert job.env == {}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "given,stored,shown",
    [("low", Priority.LOW, "low"), ("HIGH", Priority.HIGH, "high"), (0, Priority.LOW, "low"),
     (50, Priority.NORMAL, "normal"), (100, Priority.HIGH, "high"), ("100", Priority.HIGH, "high")],
)
def test_priority_names_and_numbers(world, client_for, given, stored, shown):
    response = post(client_for("bob"), {**GOOD, "priority": given})
    assert response.status_code == 201, response.json()
    assert Job.objects.get().priority == stored
    assert response.json()["priority"] == shown


@pytest.mark.django_db
def test_superuser_may_submit_to_any_group(world, client_for):
    response = post(client_for("admin"), {**GOOD, "group": "other", "instance_type": "cpu-tiny"})
    assert response.status_code == 201, response.json()
    assert Job.objects.get().user == world.users["admin"]


@pytest.fixture
def research_only(world):
    """An image and an instance type allowed only in research."""
    image = Image.objects.create(name="research-image", url="example/research:1")
    image.groups.add(world.groups["research"])
    it = InstanceType.objects.create(name="research-gpu", gpu=1, cpu_millicores=1000, memory_bytes=1 << 30)
    it.groups.add(world.groups["research"])
    return image, it


BAD_INPUTS = {
    "unknown group": ("bob", {"group": "nope"}, "group"),
    "unknown image": ("bob", {"image": "nope"}, "image"),
    "unknown instance type": ("bob", {"instance_type": "gpu-999"}, "instance_type"),
    "image of another group": ("lin", {"image": "research-image"}, "image"),
    "instance type of another group": ("lin", {"instance_type": "research-gpu"}, "instance_type"),
    "group the user is not in": ("eve", {"group": "phusers", "instance_type": "cpu-tiny"}, "group"),
    "missing group": ("bob", {"group": None}, "group"),
    "negative replicas": ("bob", {"replicas": -1}, "replicas"),
    "zero replicas": ("bob", {"replicas": 0}, "replicas"),
    "huge replicas": ("bob", {"replicas": 10**9}, "replicas"),
    "replicas not a number": ("bob", {"replicas": "many"}, "replicas"),
    "fractional replicas": ("bob", {"replicas": 1.5}, "replicas"),
    "unknown priority": ("bob", {"priority": "urgent"}, "priority"),
    "priority not a level": ("bob", {"priority": 75}, "priority"),
    "priority bool": ("bob", {"priority": True}, "priority"),
    "bad env name": ("bob", {"env": {"1BAD": "x"}}, "env"),
    "env not an object": ("bob", {"env": ["A=1"]}, "env"),
    "env string": ("bob", {"env": "A=1"}, "env"),
    "env reserved": ("bob", {"env": {"JOB_ID": "7"}}, "env"),
    "env reserved for the rendezvous": ("bob", {"env": {"MASTER_PORT": "29500"}}, "env"),
    "env reserved for torchrun": ("bob", {"env": {"PET_NNODES": "4"}}, "env"),
    "env value object": ("bob", {"env": {"A": {"b": 1}}}, "env"),
    "empty command": ("bob", {"command": ""}, "command"),
    "blank command": ("bob", {"command": "   "}, "command"),
    "missing command": ("bob", {"command": None}, "command"),
    "NUL in command": ("bob", {"command": "echo \x00"}, "command"),
    "1 MB command": ("bob", {"command": "x" * 1_000_000}, "command"),
    "name too long": ("bob", {"name": "n" * 129}, "name"),
    "bad job type": ("bob", {"job_type": "batch"}, "job_type"),
    "negative backoff": ("bob", {"backoff_limit": -1}, "backoff_limit"),
    "zero deadline": ("bob", {"active_deadline_seconds": 0}, "active_deadline_seconds"),
    "deadline over 30 days": ("bob", {"active_deadline_seconds": 30 * 86400 + 1}, "active_deadline_seconds"),
    "ttl over a year": ("bob", {"ttl_seconds_after_finished": 366 * 86400}, "ttl_seconds_after_finished"),
    "preemptible not a bool": ("bob", {"preemptible": "perhaps"}, "preemptible"),
    "over the user quota in research": (
        "lin", {"group": "research", "instance_type": "gpu-4", "replicas": 2}, "replicas"
    ),
    "over the quotas in phusers": ("bob", {"instance_type": "gpu-4", "replicas": 2}, "replicas"),
    "unknown field": ("bob", {"foo": 1}, "foo"),
    # Strict JSON types: nothing is converted behind the caller's back.
    "command a number": ("bob", {"command": 5}, "command"),
    "command a list": ("bob", {"command": ["python", "train.py"]}, "command"),
    "command a boolean": ("bob", {"command": True}, "command"),
    "group a number": ("bob", {"group": 7}, "group"),
    "image an object": ("bob", {"image": {"name": "base-notebook"}}, "image"),
    "instance type a number": ("bob", {"instance_type": 1}, "instance_type"),
    "name a number": ("bob", {"name": 2024}, "name"),
    "env value a list": ("bob", {"env": {"A": [1]}}, "env"),
    "env value null": ("bob", {"env": {"A": None}}, "env"),
    "env value a boolean": ("bob", {"env": {"A": True}}, "env"),
    "replicas a string": ("bob", {"replicas": "2"}, "replicas"),
    "replicas a whole float": ("bob", {"replicas": 2.0}, "replicas"),
    "replicas a boolean": ("bob", {"replicas": True}, "replicas"),
    "backoff limit a string": ("bob", {"backoff_limit": "3"}, "backoff_limit"),
    "deadline a string": ("bob", {"active_deadline_seconds": "3600"}, "active_deadline_seconds"),
    "preemptible a string": ("bob", {"preemptible": "true"}, "preemptible"),
    "preemptible a number": ("bob", {"preemptible": 1}, "preemptible"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("username,change,field", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_400_naming_the_field(world, research_only, client_for, username, change, field):
    body = {**GOOD, **change}
    body = {k: v for k, v in body.items() if v is not None}

    response = post(client_for(username), body)

    assert response.status_code == 400, response.content[:300]
    body = response.json()
    assert set(body) == {"detail", "errors"}
    errors = body["errors"]
    assert field in errors, errors
    assert field in body["detail"]
    assert isinstance(errors[field], list) and all(isinstance(m, str) and m for m in errors[field])
    assert_nothing_written()


@pytest.mark.django_db
def test_unknown_fields_are_named_with_other_errors(world, client_for):
    response = post(client_for("bob"), {**GOOD, "foo": 1, "gpus": 2, "replicas": 0})
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"foo", "gpus", "replicas"}
    assert_nothing_written()


@pytest.mark.django_db
def test_service_errors_name_every_field(world, client_for):
    response = post(client_for("bob"), {**GOOD, "group": "nope", "image": "nope", "env": {"JOB_ID": "1"}})
    assert response.status_code == 400
    assert {"group", "image", "env"} <= set(response.json()["errors"])
    assert_nothing_written()


@pytest.mark.django_db
def test_messages_are_readable(world, client_for):
    errors = post(client_for("eve"), {**GOOD, "instance_type": "cpu-tiny"}).json()["errors"]
    assert errors["group"] == ["You are not a member of group 'phusers'."]
    errors = post(client_for("bob"), {**GOOD, "instance_type": "gpu-4", "replicas": 2}).json()["errors"]
    assert "can never run" in errors["replicas"][0]
    errors = post(client_for("bob"), {**GOOD, "priority": "urgent"}).json()["errors"]
    assert "urgent" in errors["priority"][0]


@pytest.mark.django_db
@pytest.mark.parametrize("size", [1 << 20, 3 << 20])  # over 1 MiB; over Django's own 2.5 MB limit
def test_body_over_one_mib_is_rejected_unread(world, client_for, size):
    body = json.dumps({**GOOD, "command": "x" * size})
    response = client_for("bob").post(JOBS_URL, body, content_type="application/json")
    assert response.status_code == 413
    assert "bytes" in response.json()["detail"]
    assert_nothing_written()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body,content_type",
    [("{not json", "application/json"), ("[1, 2]", "application/json"), ('{"x": NaN}', "application/json"),
     ("[" * 100_000 + "]" * 100_000, "application/json"), ("group=phusers", "application/x-www-form-urlencoded")],
    ids=["malformed", "list", "nan", "deep", "form"],
)
def test_bodies_that_are_not_a_json_object(world, client_for, body, content_type):
    response = client_for("bob").post(JOBS_URL, body, content_type=content_type)
    assert response.status_code in (400, 415)
    assert response.json()
    assert_nothing_written()


@pytest.mark.django_db
def test_type_errors_say_what_was_given(world, client_for):
    errors = post(client_for("bob"), {**GOOD, "command": 5, "replicas": "2", "preemptible": "yes"}).json()["errors"]
    assert errors["command"] == ["Give a string, not a number (5)."]
    assert errors["replicas"] == ["Give a whole number, not a string ('2')."]
    assert errors["preemptible"] == ["Give true or false, not a string ('yes')."]
    assert_nothing_written()


@pytest.mark.django_db
def test_env_numbers_are_still_kept_as_strings(world, client_for):
    response = post(client_for("bob"), {**GOOD, "env": {"EPOCHS": 10, "LR": 0.1}})
    assert response.status_code == 201, response.content[:300]
    assert Job.objects.get().env == {"EPOCHS": "10", "LR": "0.1"}
