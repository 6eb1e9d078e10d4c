"""Queue, utilisation and GPU-hours selectors."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import selectors, services
from jobs.choices import Phase
from scheduler.passes import schedule_pass

pytestmark = [pytest.mark.fast, pytest.mark.django_db]


def test_group_queue_in_priority_then_fifo_order(submit, world):
    submit("bob", "gpu-4", name="holder")
    schedule_pass()
    a = submit("pan", "gpu-2", name="a")
    b = submit("lin", "gpu-2", name="b", priority=100)
    schedule_pass()
    assert [j.name for j in selectors.group_queue(world.groups["phusers"])] == ["b", "a"]
    assert [j.pk for j in selectors.group_queue(world.groups["phusers"])] == [b.pk, a.pk]


def test_group_user_usage_and_cluster_utilisation(submit, world):
    submit("bob", "gpu-2")
    submit("lin", "gpu-1")
    submit("lin", "gpu-4")  # waits
    schedule_pass()
    usage = {row["user"]: row["used"]["gpu"] for row in selectors.group_user_usage(world.groups["phusers"])}
    assert usage == {"bob": 2, "lin": 1}
    util = selectors.cluster_utilisation(world.users["lin"])
    assert (util["gpu_total"], util["gpu_used"], util["gpu_free"]) == (8, 3, 5)
    assert [(n.name, n.gpu_used) for n in util["nodes"]] == [("local", 3)]
    lin = next(u for u in util["users"] if u["user"] == "lin")
    assert (lin["running"], lin["running_gpu"], lin["queued"], lin["queued_gpu"]) == (1, 1, 1, 4)
    assert util["groups"] == [{"group": "phusers", "member": True, "gpu_quota": 4, "running": 2, "running_gpu": 3,
                               "queued": 1, "queued_gpu": 4}]
    # Not a member of phusers: the same group in aggregate, and none of its users.
    eve = selectors.cluster_utilisation(world.users["eve"])
    assert eve["users"] == [] and eve["groups"] == [{**util["groups"][0], "member": False}]


def test_gpu_hours_per_day_group_and_user(submit, world):
    t0 = timezone.now().replace(hour=10, minute=0, second=0, microsecond=0)
    done = submit("bob", "gpu-2")
    schedule_pass(now=t0)
    done.refresh_from_db()
    services.job_transition(job=done, phase=Phase.SUCCEEDED, exit_code=0, now=t0 + timedelta(hours=3))
    live = submit("lin", "gpu-1")
    schedule_pass(now=t0)
    other = submit("lin", "gpu-1", group="research")
    schedule_pass(now=t0)

    rows = selectors.gpu_usage(world.users["bob"], since=t0.date(), until=t0.date(), now=t0 + timedelta(hours=1))
    assert {(r["group"], r["user"]): r["gpu_hours"] for r in rows} == {
        ("phusers", "bob"): 6.0, ("phusers", "lin"): 1.0}
    rows = selectors.gpu_usage(world.users["lin"], since=t0.date(), until=t0.date(), username="lin",
                               now=t0 + timedelta(hours=2))
    assert {(r["group"], r["user"]): r["gpu_hours"] for r in rows} == {
        ("phusers", "lin"): 2.0, ("research", "lin"): 2.0}
    assert selectors.gpu_usage(world.users["eve"], since=t0.date(), until=t0.date()) == []
    assert live.pk and other.pk
