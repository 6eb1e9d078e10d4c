"""The seed's PrimeHub examples 1 and 2, submitted and watched through the API."""

import pytest

from scheduler.passes import schedule_pass

from .conftest import JOBS_URL, job_url


def submit(client_for, username: str, instance_type: str, name: str) -> int:
    body = {"name": name, "group": "phusers", "image": "base-notebook", "instance_type": instance_type,
            "command": "python train.py"}
    response = client_for(username).post(JOBS_URL, body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


@pytest.mark.django_db
def test_example_1_group_quota_blocks_fifo(world, client_for):
    a = submit(client_for, "bob", "gpu-2", "A")
    b = submit(client_for, "pan", "gpu-4", "B")
    c = submit(client_for, "lin", "gpu-2", "C")

    schedule_pass()

    bob = client_for("bob")
    ja, jb, jc = (bob.get(job_url(pk)).json() for pk in (a, b, c))
    assert ja["phase"] == "PREPARING"
    assert ja["current_attempt"] == 1
    assert (jb["phase"], jb["reason"], jb["queue_position"]) == ("PENDING", "GroupQuota", 1)
    assert "group GPU quota" in jb["message"]
    assert (jc["phase"], jc["queue_position"]) == ("PENDING", 2)
    assert jc["reason"] == "BlockedByQueueHead"
    assert jb["color_name"] == jc["color_name"] == "orange"

    pending = bob.get(JOBS_URL, {"phase": "PENDING"}).json()["results"]
    assert [(j["name"], j["queue_position"]) for j in pending] == [("C", 2), ("B", 1)]


@pytest.mark.django_db
def test_example_2_user_quota_does_not_block_others(world, client_for):
    a = submit(client_for, "bob", "gpu-2", "A")
    b = submit(client_for, "bob", "gpu-4", "B")
    c = submit(client_for, "lin", "gpu-2", "C")

    schedule_pass()

    lin = client_for("lin")
    ja, jb, jc = (lin.get(job_url(pk)).json() for pk in (a, b, c))
    assert ja["phase"] == "PREPARING"
    assert (jb["phase"], jb["reason"], jb["queue_position"]) == ("PENDING", "UserQuota", 1)
    assert "user GPU quota" in jb["message"]
    assert jc["phase"] == "PREPARING"
