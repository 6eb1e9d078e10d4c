"""The arrays API: an array or sweep submit (``POST /api/v1/jobs/`` with ``array`` / ``sweep``) answered with the
array resource, ``/api/v1/arrays/`` and ``/arrays/<id>/`` with counts and members, and cancel, stop and
restart-failed on a whole array, under the single job's permission rules."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.choices import Phase
from jobs.models import Job, JobArray, JobEvent, SubmitKey

from .conftest import API, JOBS_URL, assert_error_shape, job_url

pytestmark = [pytest.mark.django_db, pytest.mark.fast]

ARRAYS_URL = f"{API}arrays/"
GOOD = {"group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny", "command": "echo $JOB_ARRAY_INDEX",
        "name": "train"}
RESOURCE = {"id", "name", "group", "user", "size", "max_running", "indices", "sweep", "created_at", "url", "counts",
            "members"}
MEMBER = {"id", "name", "array_index", "array_params", "phase", "status", "reason"}


def array_url(array_id: int, action: str = "") -> str:
    return f"{ARRAYS_URL}{array_id}/" + (f"{action}/" if action else "")


def post(client, body, key=None):
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(JOBS_URL, body, format="json", headers=headers)


def test_an_array_submit_answers_the_array_with_its_members(world, client_for):
    response = post(client_for("bob"), {**GOOD, "array": "0-4%2"})
    assert response.status_code == 201, response.json()
    data = response.json()
    assert set(data) == RESOURCE
    array = JobArray.objects.get()
    assert data["id"] == array.pk and response["Location"] == data["url"]
    assert data["url"].endswith(array_url(array.pk))
    assert (data["name"], data["group"], data["user"], data["size"], data["max_running"], data["indices"],
            data["sweep"]) == ("train", "phusers", "bob", 5, 2, "0-4%2", {})
    assert data["counts"] == {"SUBMITTED": 5}
    assert [set(m) for m in data["members"]] == [MEMBER] * 5
    assert [(m["name"], m["array_index"], m["array_params"], m["phase"]) for m in data["members"]] == [
        (f"train[{i}]", i, {}, "SUBMITTED") for i in range(5)]
    ids = [m["id"] for m in data["members"]]
    assert ids == sorted(Job.objects.filter(array=array).values_list("pk", flat=True))
    job = client_for("bob").get(job_url(ids[3])).json()
    assert job["env"] == {"JOB_ARRAY_ID": str(array.pk), "JOB_ARRAY_INDEX": "3"}


def test_every_member_of_an_array_submitted_after_a_job_waits_for_it(world, client_for, submit):
    first = submit("bob")
    response = post(client_for("bob"), {**GOOD, "array": "0-2", "after": [{"job": first.pk, "when": "ok"}]})
    assert response.status_code == 201, response.json()
    members = Job.objects.filter(array_id=response.json()["id"])
    assert sorted(members.values_list("phase", "reason", "dependency_wait")) == [
        (Phase.PENDING, "Dependency", True)] * 3
    assert {d.on_job_id for m in members for d in m.dependencies.all()} == {first.pk}


def test_a_sweep_submit_gives_one_member_per_point_with_its_variables(world, client_for):
    response = post(client_for("bob"), {**GOOD, "sweep": {"lr": [1e-4, 3e-4], "bs": [32, 64]}, "array": "%2",
                                        "env": {"EPOCHS": "3"}})
    assert response.status_code == 201, response.json()
    data = response.json()
    assert (data["size"], data["max_running"], data["indices"]) == (4, 2, "%2")
    assert [m["name"] for m in data["members"]] == ["train[lr=0.0001,bs=32]", "train[lr=0.0001,bs=64]",
                                                   "train[lr=0.0003,bs=32]", "train[lr=0.0003,bs=64]"]
    assert data["members"][2]["array_params"] == {"lr": 3e-4, "bs": 32}
    env = Job.objects.get(pk=data["members"][2]["id"]).env
    assert env == {"EPOCHS": "3", "JOB_ARRAY_ID": str(data["id"]), "JOB_ARRAY_INDEX": "2", "SWEEP_LR": "0.0003",
                   "SWEEP_BS": "32"}


@pytest.mark.parametrize(("change", "field"), [
    ({"array": "0-5%0"}, "array"),
    ({"array": "nonsense"}, "array"),
    ({"array": 5}, "array"),
    ({"array": "%2"}, "array"),
    ({"array": "0-3", "sweep": {"lr": [1]}}, "array"),
    ({"sweep": {"lr": []}}, "sweep"),
    ({"sweep": {"lr": [1], "LR": [2]}}, "sweep"),
    ({"sweep": [1, 2]}, "sweep"),
    ({"array": "0-20000"}, "array"),
    ({"array": "0-3", "instance_type": "gpu-9"}, "instance_type"),
    ({"array": "0-3", "group": "research"}, "group"),
])
def test_bad_arrays_are_400_naming_the_field_and_write_nothing(world, client_for, change, field):
    assert_error_shape(post(client_for("bob"), {**GOOD, **change}), 400, field)
    assert not JobArray.objects.exists() and not Job.objects.exists() and not JobEvent.objects.exists()


def test_a_clone_is_one_job(world, client_for, submit):
    job = submit("bob")
    response = client_for("bob").post(job_url(job.pk, "clone"), {"array": "0-3"}, format="json")
    assert_error_shape(response, 400, "array")


def test_a_1000_member_array_is_one_request_of_few_queries(world, client_for):
    bob = client_for("bob")
    with CaptureQueriesContext(connection) as captured:
        response = post(bob, {**GOOD, "array": "0-999%8"})
    assert response.status_code == 201
    assert len(response.json()["members"]) == 1000
    # Savepoints are the test's own transaction (a request's outer transaction opens none).
    queries = [q["sql"] for q in captured.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    print(f"\n1,000-member array submit: {len(queries)} queries")
    # The token (1), the spec's checks (group, membership, image and its groups, instance type and its groups,
    # quotas: 7), the array, its members, their events (3).
    assert len(queries) <= 8, "\n".join(q[:120] for q in queries)
    assert Job.objects.filter(array_id=response.json()["id"]).count() == 1000


def test_the_idempotency_key_answers_the_array_it_made(world, client_for):
    bob = client_for("bob")
    body = {**GOOD, "sweep": {"lr": [1, 2, 3]}}
    first = post(bob, body, key="k-1")
    again = post(bob, body, key="k-1")
    assert (first.status_code, first["Idempotent-Replayed"]) == (201, "false")
    assert (again.status_code, again["Idempotent-Replayed"]) == (201, "true")
    assert again.json()["id"] == first.json()["id"] and again["Location"] == first["Location"]
    assert [m["id"] for m in again.json()["members"]] == [m["id"] for m in first.json()["members"]]
    assert JobArray.objects.count() == 1 and Job.objects.count() == 3
    assert SubmitKey.objects.get().job_id == first.json()["members"][0]["id"]
    other = post(bob, {**body, "sweep": {"lr": [1, 2]}}, key="k-1")
    assert_error_shape(other, 422)


def test_the_list_and_detail_show_counts_and_members_to_the_group_only(world, client_for):
    bob = client_for("bob")
    first = post(bob, {**GOOD, "array": "0-2"}).json()
    second = post(bob, {**GOOD, "name": "eval", "sweep": {"x": ["a", "b"]}}).json()
    Job.objects.filter(pk=first["members"][0]["id"]).update(phase=Phase.RUNNING)

    listed = client_for("pan").get(ARRAYS_URL)
    assert listed.status_code == 200
    results = listed.json()["results"]
    assert [a["id"] for a in results] == [second["id"], first["id"]]  # newest first
    assert "members" not in results[0]
    assert results[1]["counts"] == {"RUNNING": 1, "SUBMITTED": 2}

    detail = client_for("pan").get(array_url(first["id"]))
    assert detail.status_code == 200
    assert set(detail.json()) == RESOURCE
    assert [m["phase"] for m in detail.json()["members"]] == ["RUNNING", "SUBMITTED", "SUBMITTED"]

    assert client_for("eve").get(ARRAYS_URL).json()["results"] == []
    assert_error_shape(client_for("eve").get(array_url(first["id"])), 404)
    assert client_for("admin").get(array_url(first["id"])).status_code == 200


def test_cancel_stop_and_restart_failed_act_on_the_whole_array(world, client_for, group_admin):
    bob = client_for("bob")
    data = post(bob, {**GOOD, "array": "0-3"}).json()
    ids = [m["id"] for m in data["members"]]
    Job.objects.filter(pk=ids[0]).update(phase=Phase.FAILED, status="Fail")

    assert_error_shape(client_for("pan").post(array_url(data["id"], "cancel")), 403)  # a teammate: not theirs
    assert_error_shape(client_for("eve").post(array_url(data["id"], "cancel")), 404)
    assert not Job.objects.filter(pk__in=ids, phase=Phase.CANCELLED).exists()

    stopped = bob.post(array_url(data["id"], "stop"))
    assert stopped.status_code == 200, stopped.json()
    assert [(m["phase"], m["status"]) for m in stopped.json()["members"]] == [
        ("FAILED", "Fail"), *[("CANCELLED", "Stopped")] * 3]
    assert stopped.json()["counts"] == {"FAILED": 1, "CANCELLED": 3}
    assert_error_shape(bob.post(array_url(data["id"], "cancel")), 400)  # nothing left to cancel

    restarted = client_for(group_admin).post(array_url(data["id"], "restart-failed"))
    assert restarted.status_code == 200, restarted.json()
    assert [m["phase"] for m in restarted.json()["members"]] == ["PENDING", "CANCELLED", "CANCELLED", "CANCELLED"]
    assert_error_shape(bob.post(array_url(data["id"], "restart-failed")), 400)

    cancelled = client_for("admin").post(array_url(data["id"], "cancel"))
    assert cancelled.status_code == 200
    assert cancelled.json()["counts"] == {"CANCELLED": 4}
