"""The seed's PrimeHub examples 1 and 2, through the real submit service and a real scheduling pass."""

import pytest

from jobs.choices import Phase
from scheduler.passes import schedule_pass


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
    assert b.queue_position == 1
    assert c.reason == "BlockedByQueueHead"
    assert f"#{b.pk} (B)" in c.message
    assert c.queue_position == 2


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
    assert b.queue_position == 1
