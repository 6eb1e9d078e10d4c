"""A pass reads, decides, then writes: a job cancelled in between keeps its cancel. (The state machine lets an ended
job be queued again, a restart: one at a time, a verdict made before the cancel put it back in the queue, and a job
the pass had decided to admit was queued again and admitted.)"""

from __future__ import annotations

import pytest
from django.utils import timezone

from jobs import services
from jobs.choices import Phase
from jobs.models import Group, Job
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


def test_a_passs_transitions_take_no_savepoint_and_a_refused_one_leaves_the_pass_going(submit, world):
    """job_transition runs in the pass's transaction without a savepoint of its own (two round trips a job): a
    job cancelled meanwhile is refused before anything of it is written, and the pass writes the others."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from scheduler.backend_factory import get_backend
    from scheduler.core import Verdict
    from scheduler.passes import apply_outcomes, decide_heads, refresh_nodes

    backend = get_backend("local")
    refresh_nodes(backend)
    jobs = [submit("bob", "gpu-1") for _ in range(3)]
    Group.objects.filter(name="phusers").update(queue_stopped=True)
    snap, outcomes = decide_heads(backend, timezone.now())
    assert {o.verdict for o in outcomes} == {Verdict.INADMISSIBLE}
    services.job_transition(job=Job.objects.get(pk=jobs[1].pk), phase=Phase.CANCELLED, reason="DeletedByUser")

    with CaptureQueriesContext(connection) as queries:
        result, _ = apply_outcomes(snap, outcomes, backend=backend, now=timezone.now())

    assert not [q["sql"] for q in queries if "SAVEPOINT" in q["sql"]]
    assert result.inadmissible == 2
    phases = {j.pk: (j.phase, j.reason) for j in Job.objects.filter(pk__in=[j.pk for j in jobs])}
    assert phases == {jobs[0].pk: (Phase.INADMISSIBLE, "QueueStopped"), jobs[1].pk: (Phase.CANCELLED, "DeletedByUser"),
                      jobs[2].pk: (Phase.INADMISSIBLE, "QueueStopped")}
    assert [e.reason for e in Job.objects.get(pk=jobs[1].pk).events.order_by("id")] == ["Submitted", "DeletedByUser"]
