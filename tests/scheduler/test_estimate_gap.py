"""While the queue churns (a pass a job), a pass simulates the waiting jobs' starts at most once per
``ESTIMATE_GAP`` of its clock (profiled under 300 jobs through 8 GPUs, the simulation was the largest single part
of the scheduler's CPU); a change it skipped is estimated by the first pass after the gap, even one that reuses
the last decision because nothing changed since."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import Phase
from scheduler import pass_estimates
from scheduler.passes import schedule_pass

pytestmark = [pytest.mark.fast, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _fresh_memory():
    pass_estimates.estimate_memory_reset()
    yield
    pass_estimates.estimate_memory_reset()


def test_a_change_within_the_gap_is_estimated_by_the_first_pass_after_it_even_a_steady_one(submit):
    gap = pass_estimates.ESTIMATE_GAP
    t0 = timezone.now().replace(microsecond=0)
    holder = submit("bob", "gpu-4", active_deadline_seconds=3600)
    first = submit("pan", "gpu-1")
    schedule_pass(now=t0)
    first.refresh_from_db()
    assert first.phase == Phase.PENDING and first.estimated_start is not None  # the first simulation
    second = submit("lin", "gpu-1")
    result = schedule_pass(now=t0 + gap / 4)  # a change, within the gap: decided, not estimated
    second.refresh_from_db()
    assert not result.carried and second.phase == Phase.PENDING and second.reason
    assert second.estimated_start is None
    schedule_pass(now=t0 + gap / 2)  # nothing changed: it writes nothing (still within the gap)
    result = schedule_pass(now=t0 + gap + timedelta(milliseconds=1))  # the gap is over
    second.refresh_from_db()
    assert result.carried  # the last decision reused: nothing read or decided again
    assert second.estimated_start is not None
    holder.refresh_from_db()
    assert holder.phase == Phase.PREPARING
