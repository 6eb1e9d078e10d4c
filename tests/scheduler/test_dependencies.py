"""Dependencies through the scheduler's rounds: a job waits out of its group's queue until what it waits for ends,
then runs, or ends DependencyNeverSatisfied when that can never be. The simulated backend on a chosen clock (no
process); one test on the local backend with a real failing process."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs import services
from jobs.choices import Phase
from scheduler.backends.sim import SimBackend

from .conftest import wait_for

T = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)


class Sim:
    """A simulated cluster and the clock the scheduler rounds run at."""

    def __init__(self, clock, durations: dict[int, float]):
        self.now = T
        self.tick = clock
        self.backend = SimBackend(1, 8, clock=lambda: self.now, durations=durations)

    def round(self, seconds: float = 0) -> None:
        self.now += timedelta(seconds=seconds)
        self.tick(now=self.now, backend=self.backend)


def phases(*jobs) -> list[tuple[str, str]]:
    for job in jobs:
        job.refresh_from_db()
    return [(job.phase, job.reason) for job in jobs]


@pytest.mark.fast
@pytest.mark.django_db
def test_b_after_a_ok_waits_with_reason_dependency_and_runs_when_a_succeeds(submit, clock):
    a = submit("bob", "gpu-1", name="train")
    b = submit("bob", "gpu-1", name="evaluate", after=[{"job": a.pk}])
    durations = {a.pk: 60, b.pk: 30}
    sim = Sim(clock, durations)

    sim.round()
    sim.round()  # a runs; b, with room to run, waits for a
    assert phases(a, b) == [(Phase.RUNNING, ""), (Phase.PENDING, "Dependency")]
    assert b.message == f"Waits for job {a.pk} to succeed" and b.dependency_wait
    sim.round(30)
    assert phases(b) == [(Phase.PENDING, "Dependency")]

    sim.round(30)  # a succeeds: b goes back into the queue and is admitted at the next round
    a.refresh_from_db()
    assert a.phase == Phase.SUCCEEDED
    b.refresh_from_db()
    assert not b.dependency_wait
    sim.round()
    sim.round()
    assert phases(b)[0][0] == Phase.RUNNING
    sim.round(30)
    assert phases(b)[0][0] == Phase.SUCCEEDED
    trail = list(b.events.values_list("reason", flat=True))
    assert trail[:3] == ["Submitted", "Dependency", "Queued"] and trail[-1] == "Completed"
    assert b.events.get(reason="Queued").message == f"Dependencies met: job {a.pk} succeeded"


@pytest.mark.fast
@pytest.mark.django_db
def test_a_job_waiting_on_a_dependency_does_not_hold_its_groups_queue(submit, clock):
    """phusers may use 4 GPUs: a (2) runs, b (2, after a) waits, c (2, submitted after b) runs before b."""
    a = submit("bob", "gpu-2")
    b = submit("bob", "gpu-2", after=[{"job": a.pk}])
    c = submit("bob", "gpu-2")
    sim = Sim(clock, {a.pk: 60, b.pk: 60, c.pk: 600})
    sim.round()
    sim.round()
    assert phases(a, b, c) == [(Phase.RUNNING, ""), (Phase.PENDING, "Dependency"), (Phase.RUNNING, "")]
    sim.round(60)  # a succeeds: b queues, and fits in what a freed
    sim.round()
    sim.round()
    assert phases(b)[0][0] == Phase.RUNNING


@pytest.mark.fast
@pytest.mark.django_db
def test_cancelling_a_job_ends_what_waits_for_it_to_succeed_and_runs_what_waits_for_it_to_end(
        world, submit, clock, act):
    a = submit("bob", "gpu-1")
    ok = submit("bob", "gpu-1", after=[{"job": a.pk}])
    any_ = submit("bob", "gpu-1", after=[{"job": a.pk, "when": "any"}])
    notok = submit("bob", "gpu-1", after=[{"job": a.pk, "when": "notok"}])
    sim = Sim(clock, {a.pk: 600, any_.pk: 30, notok.pk: 30})
    sim.round()
    sim.round()
    assert phases(a)[0][0] == Phase.RUNNING

    act(services.job_cancel, job=a, by=world.users["bob"])
    for _ in range(3):
        sim.round(1)
    assert phases(a, ok) == [(Phase.CANCELLED, "CancelledByUser"), (Phase.CANCELLED, "DependencyNeverSatisfied")]
    event = ok.events.last()
    assert (event.type, event.reason) == ("Warning", "DependencyNeverSatisfied")
    assert event.message == (f"Waited for job {a.pk} to succeed, which can never happen: job {a.pk} was "
                             "cancelled")
    sim.round(30)
    sim.round(30)
    assert [p for p, _ in phases(any_, notok)] == [Phase.SUCCEEDED, Phase.SUCCEEDED]


@pytest.mark.fast
@pytest.mark.django_db
def test_a_job_after_an_array_runs_once_every_member_succeeded(world, submit, clock):
    from tests.jobs.test_dependencies import make_array

    array, members = make_array(world, 3)
    b = submit("bob", after=[{"array": array.pk}])
    sim = Sim(clock, {members[0].pk: 10, members[1].pk: 20, members[2].pk: 40, b.pk: 5})
    sim.round()
    sim.round()
    assert {p for p, _ in phases(*members)} == {Phase.RUNNING}
    sim.round(20)
    assert [p for p, _ in phases(*members)] == [Phase.SUCCEEDED, Phase.SUCCEEDED, Phase.RUNNING]
    assert phases(b) == [(Phase.PENDING, "Dependency")]
    sim.round(20)
    sim.round()
    sim.round()
    sim.round(5)
    assert phases(b)[0][0] == Phase.SUCCEEDED
    assert b.events.get(reason="Queued").message == f"Dependencies met: array {array.pk} succeeded"


@pytest.mark.django_db
def test_c_after_a_ok_where_a_fails_ends_dependency_never_satisfied(submit, clock):
    """The local backend: a really exits 3 (no retry); c can never run, n (after a fails) runs."""
    a = submit("bob", command="exit 3", backoff_limit=0)
    c = submit("bob", command="true", after=[{"job": a.pk}])
    n = submit("bob", command="true", after=[{"job": a.pk, "when": "notok"}])
    wait_for(a, {Phase.FAILED, Phase.SUCCEEDED}, clock)
    assert (a.phase, a.exit_code) == (Phase.FAILED, 3)
    c.refresh_from_db()
    assert (c.phase, c.status, c.reason) == (Phase.CANCELLED, "Cancelled", "DependencyNeverSatisfied")
    event = c.events.last()
    assert (event.type, event.reason) == ("Warning", "DependencyNeverSatisfied")
    assert event.message == f"Waited for job {a.pk} to succeed, which can never happen: job {a.pk} failed"
    wait_for(n, {Phase.SUCCEEDED, Phase.FAILED}, clock)
    assert n.phase == Phase.SUCCEEDED
