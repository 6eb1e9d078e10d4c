"""The replay keeps to the real scheduler: one scenario run through both, every phase change compared in order.

The real side is the scheduler over the database (its passes, sync and housekeeping, the services) on the simulated
backend, its clock moved from event to event as the replay moves its own; the replay is
``scheduler.simulation.replay`` in memory. Both must make the same transitions (job, from, to, reason) in the same
order: a change to admission, preemption, reconcile or the services that the other side does not follow fails here.
"""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models.signals import post_save

from jobs import services
from jobs.choices import Phase, Role
from jobs.models import GroupQuota, Job
from scheduler.backends.sim import SimBackend
from scheduler.simulation.replay import MAX_ROUNDS, Replay
from scheduler.simulation.workload import parse_workload

T0 = datetime(2026, 1, 1, tzinfo=UTC)  # the replay's virtual time zero

# Two groups as the test world has them (phusers: 4 GPUs, may borrow up to 8; research: 8 GPUs; 4 GPUs a user)
# on one node of 8 GPUs.
HEADER = {"groups": {"phusers": {"quota": 4, "limit": 8, "user_quota": 4},
                     "research": {"quota": 8, "user_quota": 4}},
          "cluster": {"nodes": 1, "gpus_per_node": 8}}
GPU_TYPES = {1: "gpu-1", 2: "gpu-2", 4: "gpu-4"}
JOBS = [
    # Two preemptible jobs of phusers: the second borrows research's idle GPUs.
    {"submit": 0, "group": "phusers", "user": "bob", "gpus": 4, "duration": 30, "preemptible": True},
    {"submit": 0, "group": "phusers", "user": "pan", "gpus": 4, "duration": 20, "preemptible": True},
    # research wants its quota back: the borrower is preempted, comes back to its queue and runs later.
    {"submit": 5, "group": "research", "user": "lin", "gpus": 4, "duration": 10, "priority": 100},
    # lin's user quota in research is spent: held until the first ends.
    {"submit": 5, "group": "research", "user": "lin", "gpus": 2, "duration": 10, "priority": 100},
    # A higher priority in phusers: preempts bob's first job; cancelled while it runs.
    {"submit": 6, "group": "phusers", "user": "lin", "gpus": 1, "duration": 50, "priority": 100},
    # Runs at once in research; cancelled while it runs.
    {"submit": 7, "group": "research", "user": "eve", "gpus": 1, "duration": 100},
    # A low priority: waits behind the others; cancelled while it waits.
    {"submit": 8, "group": "phusers", "user": "bob", "gpus": 2, "duration": 5, "priority": 0},
    # Comes after it and runs once the node has room.
    {"submit": 9, "group": "phusers", "user": "pan", "gpus": 2, "duration": 5},
]
CANCELS = {5: 9.0, 6: 12.0, 7: 20.0}  # job number (from 1) → when its user cancels it


def replayed(jobs: list[dict]) -> list[tuple[float, int, str, str, str]]:
    replay = Replay(parse_workload([json.dumps(HEADER), *map(json.dumps, jobs)]), cancels=CANCELS)
    replay.run()
    return replay.transitions


def scheduled(world, submit, clock, act, jobs: list[dict]) -> list[tuple[float, int, str, str, str]]:
    """The same scenario through the real scheduler: every phase change saved to a job's row."""
    GroupQuota.objects.filter(group=world.groups["phusers"]).update(limit=8)
    GroupQuota.objects.filter(group=world.groups["research"]).update(user_quota=4)
    world.groups["research"].memberships.get_or_create(user=world.users["eve"], defaults={"role": Role.MEMBER})
    number: dict[int, int] = {}  # job id → its number in the scenario
    phases: dict[int, str] = {}  # job id → its phase as last saved
    seen: list[tuple[float, int, str, str, str]] = []
    now = [T0]

    def saved(sender, instance, created, **kw):
        before = phases.get(instance.pk)
        phases[instance.pk] = instance.phase
        if not created and before != instance.phase and instance.pk in number:
            seen.append(((now[0] - T0).total_seconds(), number[instance.pk], before, instance.phase, instance.reason))

    post_save.connect(saved, sender=Job, dispatch_uid="replay-contract")
    try:
        drive(world, submit, clock, act, jobs, number, now, seen)
    finally:
        post_save.disconnect(sender=Job, dispatch_uid="replay-contract")
    return seen


def drive(world, submit, clock, act, jobs: list[dict], number: dict[int, int], now: list[datetime], seen: list
          ) -> None:
    """Submit, cancel and run scheduler rounds on the simulated backend, moment by moment (``now[0]``)."""
    durations: dict[int, float] = {}
    sim = SimBackend(1, 8, clock=lambda: now[0], durations=durations)
    arrivals = sorted(enumerate(jobs, start=1), key=lambda e: (e[1]["submit"], e[0]))
    cancels = sorted((t, n) for n, t in CANCELS.items())
    submitted: dict[int, Job] = {}  # job number → its row
    while arrivals or cancels or sim.next_change() is not None:
        moments = [T0 + timedelta(seconds=arrivals[0][1]["submit"])] if arrivals else []
        moments += [T0 + timedelta(seconds=cancels[0][0])] if cancels else []
        moments += [sim.next_change()] if sim.next_change() is not None else []
        now[0] = min(moments)
        while arrivals and T0 + timedelta(seconds=arrivals[0][1]["submit"]) <= now[0]:
            n, spec = arrivals.pop(0)
            job = submit(spec["user"], GPU_TYPES[spec["gpus"]], group=spec["group"],
                         priority=spec.get("priority", 50), preemptible=spec.get("preemptible", False))
            Job.objects.filter(pk=job.pk).update(queued_at=now[0] + timedelta(microseconds=n))
            number[job.pk], submitted[n], durations[job.pk] = n, job, spec["duration"]
        while cancels and T0 + timedelta(seconds=cancels[0][0]) <= now[0]:
            n = cancels.pop(0)[1]
            act(services.job_cancel, job=submitted[n], by=world.users[jobs[n - 1]["user"]])
        quiet = 0
        for _ in range(MAX_ROUNDS):  # settle this moment, as the replay does: rounds until two change nothing
            before = len(seen)
            clock(now=now[0], backend=sim)
            quiet = quiet + 1 if len(seen) == before else 0
            if quiet == 2:
                break
        sim.due(now[0])


def in_order(transitions: list[tuple]) -> list[tuple]:
    """Moment by moment, each job's changes in the order they happened. Into the queue is left out: the replay
    queues a job as it arrives ("Queued"), a pass over the database with the reason it waits for. Between jobs of
    one moment the order is the order sync visits them in, which the two sides need not share."""
    return sorted((t for t in transitions if t[2] != Phase.SUBMITTED), key=lambda t: (t[0], t[1]))


@pytest.mark.django_db
def test_the_replay_makes_the_transitions_the_scheduler_makes(world, submit, clock, act):
    real = in_order(scheduled(world, submit, clock, act, JOBS))
    assert real == in_order(replayed(JOBS))
    reasons = {t[4] for t in real}
    assert {"Admitted", "Preempted", "CancelledByUser", "Completed"} <= reasons  # what the scenario is meant to cover
    assert len(real) == 32


@pytest.mark.xfail(strict=True, reason="the replay decides again only when a job arrives, ends or is requeued, not "
                   "after an admission: the scheduler's next pass preempts a borrower admitted the pass before for "
                   "a job of a group under its quota, the replay leaves it running")
@pytest.mark.django_db
def test_a_borrower_admitted_beside_a_held_job_of_a_group_under_its_quota(world, submit, clock, act):
    jobs = [dict(j) for j in JOBS]
    jobs[3]["priority"] = 50  # decided after the borrower (job 2) at 15 s: no room left for it in that pass
    assert in_order(scheduled(world, submit, clock, act, jobs)) == in_order(replayed(jobs))
