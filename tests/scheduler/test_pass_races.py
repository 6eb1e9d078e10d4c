"""A pass reads, decides, then writes: a job cancelled in between keeps its cancel. (The state machine lets an ended
job be queued again, a restart: one at a time, a verdict made before the cancel put it back in the queue, and a job
the pass had decided to admit was queued again and admitted.)"""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs import services
from jobs.choices import Phase
from jobs.models import Job
from tests.live.conftest import pending

pytestmark = [pytest.mark.django_db, pytest.mark.fast]


def test_a_job_cancelled_while_a_pass_decided_stays_cancelled(submit):
    """Its waiting verdict is not written: it was put back in the queue, PENDING."""
    from scheduler.backend_factory import get_backend
    from scheduler.core import Verdict
    from scheduler.passes import apply_outcomes, decide_heads, refresh_nodes

    backend = get_backend("local")
    refresh_nodes(backend)
    first, second = submit("bob", "gpu-4"), submit("bob", "gpu-4")  # bob may hold 4 GPUs: the second waits
    snap, outcomes = decide_heads(backend, timezone.now())
    assert {o.job_id: o.verdict for o in outcomes} == {first.pk: Verdict.ADMIT, second.pk: Verdict.WAIT}
    services.job_transition(job=Job.objects.get(pk=second.pk), phase=Phase.CANCELLED, reason="DeletedByUser")
    apply_outcomes(snap, outcomes, backend=backend, now=timezone.now())
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.phase, second.phase) == (Phase.PREPARING, Phase.CANCELLED)
    assert second.events.order_by("id").last().reason == "DeletedByUser"


def test_a_job_cancelled_before_the_pass_admitted_it_stays_cancelled_without_an_attempt(submit):
    """Neither queued again nor admitted, and no attempt made for it (the submitted one was queued and admitted)."""
    from scheduler.backend_factory import get_backend
    from scheduler.core import Verdict
    from scheduler.passes import apply_outcomes, decide_heads, refresh_nodes

    backend = get_backend("local")
    refresh_nodes(backend)
    queued, submitted = pending(submit("bob", "gpu-1")), submit("pan", "gpu-1")
    snap, outcomes = decide_heads(backend, timezone.now())
    assert {o.job_id: o.verdict for o in outcomes} == {queued.pk: Verdict.ADMIT, submitted.pk: Verdict.ADMIT}
    for job in (queued, submitted):
        services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.CANCELLED, reason="DeletedByUser")
    result, _ = apply_outcomes(snap, outcomes, backend=backend, now=timezone.now())
    assert result.admitted == []
    for job in (queued, submitted):
        job.refresh_from_db()
        assert job.phase == Phase.CANCELLED and job.attempts.count() == 0
        assert job.events.order_by("id").last().reason == "DeletedByUser"
