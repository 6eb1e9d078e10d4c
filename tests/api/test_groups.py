"""GET /groups/, /groups/{name}/, its queue, instance types and images: your groups only."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.choices import Resource, Role
from jobs.models import Group, GroupQuota, Image, Membership
from scheduler.passes import schedule_pass

from .conftest import API, assert_error_shape, group_url

GROUPS_URL = API + "groups/"


@pytest.mark.django_db
def test_groups_of_the_user_with_quotas_and_usage(world, submit, client_for):
    submit("bob", "gpu-2")
    submit("pan", "gpu-1")
    submit("lin", "gpu-4")  # waits: the group quota is 4
    schedule_pass()

    data = client_for("lin").get(GROUPS_URL).json()
    assert data["count"] == 2
    phusers, research = data["results"]
    assert (phusers["name"], research["name"]) == ("phusers", "research")
    assert phusers["role"] == "member"
    assert phusers["usage"] == {"gpu": 3, "cpu": 24000, "memory": 96 << 30}
    assert phusers["my_usage"] == {"gpu": 0, "cpu": 0, "memory": 0}
    assert (phusers["running_jobs"], phusers["queued_jobs"]) == (2, 1)
    assert phusers["quotas"] == [{"resource": "gpu", "quota": 4, "limit": None, "user_quota": 4, "used": 3,
                                  "used_by_me": 0}]
    assert research["usage"]["gpu"] == 0 and research["queue_stopped"] is False

    assert [g["name"] for g in client_for("eve").get(GROUPS_URL).json()["results"]] == ["other"]
    assert client_for("eve").get(GROUPS_URL).json()["results"][0]["role"] == "admin"
    admin = client_for("admin").get(GROUPS_URL).json()["results"]
    assert [g["name"] for g in admin] == ["other", "phusers", "research"]
    assert {g["role"] for g in admin} == {None}


@pytest.mark.django_db
def test_group_list_queries_do_not_grow_with_groups(world, client_for, make_user):
    client = client_for("admin")
    with CaptureQueriesContext(connection) as few:
        client.get(GROUPS_URL)
    for i in range(10):
        group = Group.objects.create(name=f"g{i}")
        GroupQuota.objects.create(group=group, resource=Resource.GPU, quota=1)
    with CaptureQueriesContext(connection) as many:
        assert client.get(GROUPS_URL).json()["count"] == 13
    assert len(many) == len(few)


@pytest.mark.django_db
def test_group_detail_with_users(world, submit, client_for):
    submit("bob", "gpu-2")
    submit("pan", "gpu-1")
    schedule_pass()
    data = client_for("pan").get(group_url("phusers")).json()
    assert data["name"] == "phusers"
    assert data["my_usage"]["gpu"] == 1
    assert [(u["user"], u["jobs"], u["used"]["gpu"]) for u in data["users"]] == [("bob", 1, 2), ("pan", 1, 1)]
    assert data["users"][0]["user_quota"]["gpu"] == 4


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["research", "nope", "UPPER", "a..b", "x" * 80])
def test_other_groups_do_not_exist(world, client_for, name):
    pan = client_for("pan")
    for action in ("", "queue", "images", "instance-types"):
        assert_error_shape(pan.get(group_url(name, action)), 404)


@pytest.mark.django_db
def test_queue_in_order_with_reasons_and_positions(world, submit, client_for):
    submit("bob", "gpu-4", name="holder")
    schedule_pass()
    a = submit("pan", "gpu-2", name="a")
    b = submit("lin", "gpu-2", name="b", priority=100)
    c = submit("bob", "gpu-1", name="c")
    schedule_pass()
    client = client_for("pan")

    data = client.get(group_url("phusers", "queue")).json()
    assert data["count"] == 3
    rows = data["results"]
    assert [(r["rank"], r["id"]) for r in rows] == [(1, b.pk), (2, a.pk), (3, c.pk)]
    assert rows[0]["priority"] == "high" and rows[0]["request"] == {"gpu": 2, "cpu": 16000, "memory": 64 << 30}
    assert [r["phase"] for r in rows] == ["PENDING"] * 3
    assert rows[0]["reason"] == "GroupQuota" and rows[0]["message"]
    assert rows[1]["reason"] == "BlockedByQueueHead"
    # bob holds his 4 GPUs, but the queue is held by its head: the jobs behind it are not looked at (Kueue-like)
    assert rows[2]["reason"] == "BlockedByQueueHead"
    assert [r["queue_position"] for r in rows] == [1, 2, 3]

    page2 = client.get(group_url("phusers", "queue"), {"page_size": 2, "page": 2}).json()
    assert [(r["rank"], r["id"]) for r in page2["results"]] == [(3, c.pk)]
    assert client.get(group_url("research", "queue")).status_code == 404
    assert client_for("lin").get(group_url("research", "queue")).json()["count"] == 0


@pytest.mark.django_db
def test_instance_types_and_images_of_a_group(world, client_for):
    special = Image.objects.create(name="special", url="example/special:1")
    special.groups.add(world.groups["research"])
    lin = client_for("lin")

    types = lin.get(group_url("research", "instance-types")).json()["results"]
    assert [t["name"] for t in types] == ["cpu-tiny", "gpu-1", "gpu-2", "gpu-4"]
    assert types[1] == {"name": "gpu-1", "display_name": "", "description": "", "gpu": 1, "cpu": 8000,
                        "memory": 32 << 30}
    assert [i["name"] for i in lin.get(group_url("research", "images")).json()["results"]] == [
        "base-notebook", "special"]
    assert [i["name"] for i in lin.get(group_url("phusers", "images")).json()["results"]] == ["base-notebook"]
    assert [t["name"] for t in client_for("eve").get(group_url("other", "instance-types")).json()["results"]] == [
        "cpu-tiny"]


@pytest.mark.django_db
def test_group_admin_role_is_shown(world, client_for):
    Membership.objects.filter(user=world.users["lin"], group=world.groups["research"]).update(role=Role.ADMIN)
    roles = {g["name"]: g["role"] for g in client_for("lin").get(GROUPS_URL).json()["results"]}
    assert roles == {"phusers": "member", "research": "admin"}
