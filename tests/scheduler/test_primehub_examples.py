"""The seed's PrimeHub examples 1 and 2, through the real submit service and a real scheduling pass."""

import pytest

from jobs.choices import Phase
from jobs.selectors import queue_positions
from scheduler.passes import schedule_pass

pytestmark = pytest.mark.fast


@pytest.mark.django_db
def test_example_1_group_quota_blocks_fifo(submit):
    a = submit("bob", "gpu-2", name="A")
    b = submit("pan", "gpu-4", name="B")
    c = submit("lin", "gpu-2", name="C")

    schedule_pass()

    for job in (a, b, c):
        job.refresh_from_db()
    assert (a.phase, b.phase, c.phase) == (Phase.PREPARING, Phase.PENDING, Phase.PENDING)
    assert b.reason == "GroupQuota"
    assert "group GPU quota of phusers: 2 GPU used of 4 GPU, asks 4 GPU" in b.message
    assert c.reason == "BlockedByQueueHead"
    assert f"#{b.pk} (B)" in c.message
    assert queue_positions([a.pk, b.pk, c.pk]) == {b.pk: 1, c.pk: 2}  # derived when read


@pytest.mark.django_db
def test_example_2_user_quota_does_not_block_others(submit):
    a = submit("bob", "gpu-2", name="A")
    b = submit("bob", "gpu-4", name="B")
    c = submit("lin", "gpu-2", name="C")

    schedule_pass()

    for job in (a, b, c):
        job.refresh_from_db()
    assert (a.phase, b.phase, c.phase) == (Phase.PREPARING, Phase.PENDING, Phase.PREPARING)
    assert b.reason == "UserQuota"
    assert "user GPU quota in phusers: 2 GPU used of 4 GPU, asks 4 GPU" in b.message
    assert queue_positions([b.pk]) == {b.pk: 1}


@pytest.mark.django_db
def test_positions_follow_the_queue_without_extra_events(submit, world):
    from jobs.services import job_cancel

    a = submit("bob", "gpu-4", name="A")
    b = submit("pan", "gpu-2", name="B")
    c = submit("lin", "gpu-2", name="C")
    d = submit("pan", "gpu-1", name="D")
    schedule_pass()
    for job in (a, b, c, d):
        job.refresh_from_db()
    assert a.phase == Phase.PREPARING
    positions = queue_positions([b.pk, c.pk, d.pk])
    assert [(j.reason, positions[j.pk]) for j in (b, c, d)] == [
        ("GroupQuota", 1), ("BlockedByQueueHead", 2), ("BlockedByQueueHead", 3)]
    events_before = d.events.count()

    job_cancel(job=c, by=world.users["lin"])
    schedule_pass()
    d.refresh_from_db()
    assert (d.reason, queue_positions([d.pk])) == ("BlockedByQueueHead", {d.pk: 2})
    assert d.events.count() == events_before  # a new position is not a new event


@pytest.mark.django_db
def test_finished_job_frees_quota_for_the_head(submit):
    from jobs.services import job_transition

    a = submit("bob", "gpu-2", name="A")
    b = submit("pan", "gpu-4", name="B")
    schedule_pass()
    a.refresh_from_db()
    job_transition(job=a, phase=Phase.SUCCEEDED, exit_code=0)
    schedule_pass()
    b.refresh_from_db()
    assert b.phase == Phase.PREPARING and queue_positions([b.pk]) == {}


@pytest.mark.django_db
def test_lowered_quota_makes_a_waiting_job_inadmissible_and_back(submit, world):
    from jobs.models import GroupQuota

    b = submit("pan", "gpu-4", name="B")
    quota = GroupQuota.objects.get(group=world.groups["phusers"], resource="gpu")
    quota.quota = 2
    quota.save()
    schedule_pass()
    b.refresh_from_db()
    assert (b.phase, b.reason) == (Phase.INADMISSIBLE, "ExceedsGroupQuota")
    assert "more than the group GPU quota 2 GPU of phusers" in b.message
    quota.quota = 4
    quota.save()
    schedule_pass()
    b.refresh_from_db()
    assert b.phase == Phase.PREPARING
