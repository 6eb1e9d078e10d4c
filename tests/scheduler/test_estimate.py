"""The start-time estimate, table-driven over pure snapshots (no database), and checked against a plain simulation
that asks decide() about every waiting job at every simulated moment."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from scheduler.core import (
    ArrayState,
    GroupState,
    Outcome,
    QueuedJob,
    QuotaLimits,
    Reason,
    ReplicaPlacement,
    Verdict,
    decide,
)
from scheduler.estimate import (
    DEADLINES,
    HISTORY,
    HORIZON,
    SOON,
    Estimate,
    HeldJob,
    estimate,
    step_time,
)
from scheduler.values import Node

pytestmark = pytest.mark.fast

NOW = datetime(2026, 1, 1, 12, 0)
BOB, PAN, LIN = 1, 2, 3
PH, RS = 10, 20
H = timedelta(hours=1)
M = timedelta(minutes=1)


def job(id, user, gpu, group=PH, priority=50, at=None, not_before=None, preemptible=False, replicas=1):
    return QueuedJob(id=id, name=f"j{id}", group_id=group, user_id=user, priority=priority,
                     queued_at=at or NOW - timedelta(hours=1) + timedelta(seconds=id), replicas=replicas,
                     request={"gpu": gpu}, preemptible=preemptible, not_before=not_before)


def held(id, user, gpu, ago, group=PH, terminating=False, ids=()):
    placement = (ReplicaPlacement("n1", tuple(ids)),) if ids else ()
    return HeldJob(id=id, group_id=group, user_id=user, replicas=1, request={"gpu": gpu}, admitted_at=NOW - ago,
                   placement=placement, terminating=terminating)


def groups(ph_quota=4, ph_user=4, rs_quota=8, rs_user=4, held_jobs=(), ph_limit=None):
    g = {
        PH: GroupState(PH, "phusers", {"gpu": QuotaLimits(ph_quota, ph_limit, ph_user)}),
        RS: GroupState(RS, "research", {"gpu": QuotaLimits(rs_quota, None, rs_user)}),
    }
    for h in held_jobs:
        g[h.group_id].usage["gpu"] = g[h.group_id].usage.get("gpu", 0) + h.request["gpu"]
        per_user = g[h.group_id].user_usage.setdefault(h.user_id, {})
        per_user["gpu"] = per_user.get("gpu", 0) + h.request["gpu"]
    return g


def node(gpu=8, held_jobs=()):
    busy = {i for h in held_jobs for p in h.placement for i in p.gpu_ids}
    used = sum(h.request["gpu"] for h in held_jobs if h.placement)
    return Node("n1", {"gpu": gpu}, {"gpu": gpu - used}, [i for i in range(gpu) if i not in busy])


def hours(n, basis=DEADLINES):
    return (n * 3600, basis)


def run(held_jobs, jobs, durations, nodes=None, **kw):
    nodes = [node(held_jobs=held_jobs)] if nodes is None else nodes
    return estimate(kw.pop("groups_", None) or groups(held_jobs=held_jobs), jobs, nodes, held_jobs, durations, NOW,
                    **kw)


# --- the grid ends are merged on ----------------------------------------------------------------------------


@pytest.mark.parametrize("now, t, expected", [
    (NOW, NOW, NOW),
    (NOW, NOW + timedelta(seconds=1), NOW + M),
    (NOW, NOW + timedelta(minutes=10, seconds=20), NOW + timedelta(minutes=11)),
    (NOW, NOW + timedelta(minutes=10, seconds=40), NOW + timedelta(minutes=11)),  # merged with the one above
    (NOW + timedelta(seconds=30), NOW + timedelta(minutes=59, seconds=30), NOW + H),  # within the hour: minutes
    (NOW, NOW + timedelta(hours=2, minutes=1), NOW + timedelta(hours=2, minutes=5)),  # up to 6 h: 5 minutes
    (NOW, NOW + timedelta(hours=7, minutes=1), NOW + timedelta(hours=7, minutes=15)),  # up to a day: 15 minutes
    (NOW, NOW + timedelta(days=3, minutes=1), NOW + timedelta(days=3, hours=1)),  # beyond: hours
])
def test_step_time_rounds_up_on_a_grid_that_coarsens_with_distance(now, t, expected):
    assert step_time(now, t) == expected


# --- tables ---------------------------------------------------------------------------------------------------

R1 = held(101, PAN, 4, ago=H)  # phusers' whole quota, admitted an hour ago

CASES = [
    # (id, held, queued, durations, expected {job: (offset from NOW, basis) | None})
    ("waits for the group quota: starts when the running job reaches its deadline",
     [R1], [job(1, BOB, 2)], {101: hours(2), 1: hours(1)},
     {1: (H, DEADLINES)}),
    ("the running job's end comes from history: basis history",
     [R1], [job(1, BOB, 2)], {101: hours(1.5, HISTORY), 1: hours(1)},
     {1: (timedelta(minutes=30), HISTORY)}),
    ("strict FIFO: the second starts when the first one ends",
     [R1], [job(1, BOB, 4), job(2, LIN, 1)], {101: hours(2), 1: hours(2), 2: hours(1)},
     {1: (H, DEADLINES), 2: (3 * H, DEADLINES)}),
    ("admitted now starts now",
     [], [job(1, BOB, 2)], {1: hours(1)},
     {1: (timedelta(0), DEADLINES)}),
    ("backing off after a requeue: not before its delay",
     [], [job(1, BOB, 2, not_before=NOW + timedelta(minutes=10))], {1: hours(1)},
     {1: (timedelta(minutes=10), DEADLINES)}),
    ("larger than the group quota: inadmissible, no estimate",
     [], [job(1, BOB, 8), job(2, PAN, 1)], {1: hours(1), 2: hours(1)},
     {1: None, 2: (timedelta(0), DEADLINES)}),
    ("beyond the horizon: no estimate",
     [R1], [job(1, BOB, 2)], {101: (HORIZON.total_seconds() + 86400, DEADLINES), 1: hours(1)},
     {1: None}),
    ("a terminating job ends about now",
     [held(101, PAN, 4, ago=H, terminating=True)], [job(1, BOB, 2)], {101: hours(24), 1: hours(1)},
     {1: (SOON, DEADLINES)}),
    ("a job past its expected end ends about now",
     [R1], [job(1, BOB, 2)], {101: hours(0.5, HISTORY), 1: hours(1)},
     {1: (SOON, HISTORY)}),
    ("a deadline end before the start makes it by deadlines, even with history ends",
     [held(101, PAN, 2, ago=H), held(102, LIN, 2, ago=H)], [job(1, BOB, 4)],
     {101: hours(2, HISTORY), 102: hours(3), 1: hours(1)},
     {1: (2 * H, DEADLINES)}),
    ("only history ends before the start: by history, though a later end is by deadline",
     [held(101, PAN, 2, ago=H), held(102, LIN, 2, ago=H)], [job(1, BOB, 2)],
     {101: hours(2, HISTORY), 102: hours(3), 1: hours(1)},
     {1: (H, HISTORY)}),
    ("a job admitted in the simulation ends its own duration later",
     [R1], [job(1, BOB, 4), job(2, PAN, 4)], {101: hours(1.5), 1: hours(0.5, HISTORY), 2: hours(1)},
     {1: (timedelta(minutes=30), DEADLINES), 2: (H, DEADLINES)}),
    ("priority before submission time",
     [R1], [job(1, BOB, 4), job(2, PAN, 4, priority=100)], {101: hours(2), 1: hours(1), 2: hours(2)},
     {2: (H, DEADLINES), 1: (3 * H, DEADLINES)}),
]


@pytest.mark.parametrize("held_jobs, jobs, durations, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_estimate(held_jobs, jobs, durations, expected):
    got = run(held_jobs, jobs, durations, nodes=[])
    assert {k: v and (v.start - NOW, v.basis) for k, v in got.items()} == expected


def test_a_job_its_users_quota_holds_back_holds_no_one():
    r = held(101, BOB, 4, ago=H)
    g = groups(ph_quota=8, held_jobs=[r])
    got = estimate(g, [job(1, BOB, 1), job(2, LIN, 1)], [], [r], {101: hours(2), 1: hours(1), 2: hours(1)}, NOW)
    assert got == {1: Estimate(NOW + H, DEADLINES), 2: Estimate(NOW, DEADLINES)}


def test_capacity_freed_by_another_group_starts_a_job():
    """research's job waits for the node, which phusers' job holds: it starts when that one ends."""
    r = held(101, PAN, 8, ago=H, ids=range(8))
    g = groups(ph_quota=8, held_jobs=[r])
    got = estimate(g, [job(1, LIN, 4, group=RS)], [node(8, [r])], [r], {101: hours(2), 1: hours(1)}, NOW)
    assert got == {1: Estimate(NOW + H, DEADLINES)}


def test_the_pass_decision_is_used_for_now_and_its_victims_end_about_now():
    """With the pass's outcomes: its admissions start now (and hold resources), its victims end about now, and a
    job preempting them is decided first once they have."""
    victim = held(101, PAN, 4, ago=H)
    g = groups(held_jobs=[victim])
    jobs = [job(1, BOB, 4, priority=100), job(2, LIN, 4, at=NOW - 2 * H)]
    outcomes = [Outcome(101, Verdict.PREEMPT, Reason.PREEMPTED, "preempted", by=1),
                Outcome(1, Verdict.WAIT, Reason.PREEMPTING, "preempting #101", position=1),
                Outcome(2, Verdict.WAIT, Reason.BLOCKED, "behind", position=2)]
    got = estimate(g, jobs, [], [victim], {101: hours(10), 1: hours(1), 2: hours(1)}, NOW, outcomes=outcomes)
    # 2 starts an hour after 1, on the 5-minute grid beyond the first hour.
    assert got == {1: Estimate(NOW + SOON, DEADLINES), 2: Estimate(NOW + timedelta(minutes=65), DEADLINES)}


def test_it_mutates_nothing_it_is_given():
    r = held(101, PAN, 4, ago=H, ids=range(4))
    g, n = groups(held_jobs=[r]), [node(8, [r])]
    estimate(g, [job(1, BOB, 2), job(2, LIN, 2)], n, [r], {101: hours(2)}, NOW)
    assert g[PH].usage == {"gpu": 4} and g[PH].user_usage == {PAN: {"gpu": 4}}
    assert n[0].free == {"gpu": 4} and n[0].free_gpu_ids == [4, 5, 6, 7]


def test_a_long_run_of_jobs_held_by_their_users_quota_does_not_hide_the_next_user():
    r = held(101, BOB, 4, ago=H)
    g = groups(ph_quota=8, ph_user=4, held_jobs=[r])
    jobs = [job(i, BOB, 1) for i in range(1, 40)] + [job(40, PAN, 1)]
    got = estimate(g, jobs, [], [r], {101: hours(2), **{i: hours(1) for i in range(1, 41)}}, NOW)
    assert got[40] == Estimate(NOW, DEADLINES)
    assert [got[i].start - NOW for i in (1, 4, 5, 8, 9)] == [H, H, 2 * H, 2 * H, 3 * H]


# --- the pruned simulation equals the plain one -------------------------------------------------------------


def plain(groups_, queued, nodes, holding, durations, now, horizon=HORIZON):
    """The reference: decide() about every waiting job (all groups) at every simulated moment."""
    gs = {gid: GroupState(g.id, g.name, g.quotas, dict(g.usage), {u: dict(v) for u, v in g.user_usage.items()})
          for gid, g in groups_.items()}
    ns = {n.name: Node(n.name, dict(n.allocatable), dict(n.free), list(n.free_gpu_ids)) for n in nodes}
    ends: dict[datetime, list] = defaultdict(list)
    times = set()
    flags = {"history": False, "deadlines": False}

    def charge(gid, user, request, replicas, placement, sign):
        for r, amount in request.items():
            gs[gid].usage[r] = gs[gid].usage.get(r, 0) + sign * amount * replicas
            u = gs[gid].user_usage.setdefault(user, {})
            u[r] = u.get(r, 0) + sign * amount * replicas
        for p in placement:
            n = ns[p.node]
            n.free["gpu"] -= sign * request["gpu"]
            n.free_gpu_ids = sorted(set(n.free_gpu_ids) - set(p.gpu_ids)) if sign > 0 else sorted(
                set(n.free_gpu_ids) | set(p.gpu_ids))

    def end(t, what):
        t = step_time(now, max(t, now + SOON) if t <= now else t)
        ends[t].append(what)
        times.add(t)

    for h in holding:
        seconds, basis = durations[h.id]
        end(now if h.terminating else h.admitted_at + timedelta(seconds=seconds),
            (h.group_id, h.user_id, h.request, h.replicas, h.placement, None if h.terminating else basis))
    started = {}
    waiting = {j.id: j for j in queued}
    for j in queued:
        if j.not_before and j.not_before > now:
            times.add(step_time(now, j.not_before))

    def admit_all(t):
        for o in decide(gs, list(waiting.values()), list(ns.values()), (), now=t):
            if o.verdict == Verdict.ADMIT:
                j = waiting.pop(o.job_id)
                basis = HISTORY if flags["history"] and not flags["deadlines"] else DEADLINES
                started[j.id] = Estimate(t, basis)
                charge(j.group_id, j.user_id, j.request, j.replicas, o.placement, +1)
                seconds, b = durations[j.id]
                end(t + timedelta(seconds=seconds), (j.group_id, j.user_id, j.request, j.replicas, o.placement, b))
            elif o.verdict == Verdict.INADMISSIBLE:
                waiting.pop(o.job_id)

    admit_all(now)
    while times and waiting:
        t = min(times)
        times.discard(t)
        if t > now + horizon:
            break
        for gid, user, request, replicas, placement, basis in ends.pop(t, []):
            charge(gid, user, request, replicas, placement, -1)
            if basis:
                flags[basis] = True
        admit_all(t)
    return {j.id: started.get(j.id) for j in queued}


def random_case(seed):
    """Two groups, three users, 0-2 nodes (room may be fragmented), jobs of 0-8 GPUs in 1-2 replicas, some
    borrowing, some of high priority, some backing off; running jobs placed on the nodes."""
    rnd = random.Random(seed)
    n_nodes = rnd.choice([0, 1, 1, 2])
    gpus = rnd.choice([4, 8])
    free = {f"n{i}": list(range(gpus)) for i in range(n_nodes)}
    holding = []
    for i in range(rnd.randint(0, 5)):
        gpu = rnd.choice([1, 1, 2, 4])
        room = [name for name, ids in free.items() if len(ids) >= gpu]
        if n_nodes and not room:
            continue
        placement = ()
        if n_nodes:
            name = rnd.choice(room)
            placement = (ReplicaPlacement(name, tuple(free[name][:gpu])),)
            del free[name][:gpu]
        holding.append(HeldJob(100 + i, rnd.choice([PH, RS]), rnd.choice([BOB, PAN, LIN]), 1, {"gpu": gpu},
                               NOW - timedelta(minutes=rnd.randint(0, 600)), placement, rnd.random() < 0.1))
    g = groups(ph_quota=rnd.choice([4, 6, 8, 16]), ph_user=rnd.choice([2, 4, 8]), rs_quota=rnd.choice([4, 8]),
               rs_user=rnd.choice([2, 4, 8]), ph_limit=rnd.choice([None, 16]), held_jobs=holding)
    nodes = [Node(name, {"gpu": gpus}, {"gpu": len(ids)}, list(ids)) for name, ids in free.items()]
    jobs = []
    for i in range(1, rnd.randint(2, 14)):
        jobs.append(job(i, rnd.choice([BOB, PAN, LIN]), rnd.choice([0, 1, 1, 1, 2, 4]), group=rnd.choice([PH, RS]),
                        priority=rnd.choice([50, 50, 100]), at=NOW - timedelta(minutes=rnd.randint(0, 300)),
                        preemptible=rnd.random() < 0.2, replicas=rnd.choice([1, 1, 1, 2]),
                        not_before=NOW + timedelta(minutes=rnd.randint(1, 90)) if rnd.random() < 0.15 else None))
    durations = {j: (rnd.choice([rnd.randint(30, 7200), rnd.randint(3600, 5 * 86400)]),
                     rnd.choice([DEADLINES, HISTORY])) for j in [h.id for h in holding] + [j.id for j in jobs]}
    return g, jobs, nodes, holding, durations


@pytest.mark.parametrize("seed", range(400))
def test_pruned_simulation_equals_the_plain_one(seed):
    g, jobs, nodes, holding, durations = random_case(seed)
    assert estimate(g, jobs, nodes, holding, durations, NOW) == plain(g, jobs, nodes, holding, durations, NOW)


# --- an array's %K ----------------------------------------------------------------------------------------------


def member(id, array, gpu=1, user=BOB):
    return replace(job(id, user, gpu), array_id=array)


@pytest.mark.parametrize("label, held_jobs, limit, expected", [
    ("without a limit the four members start now", [], None, [0, 0, 0, 0]),
    ("%2: two now, the next two as the first two end", [], 2, [0, 0, 1, 1]),
    ("%1: one at a time", [], 1, [0, 1, 2, 3]),
    ("%2 with one member already holding: one now, then in twos as they end",
     [replace(held(100, BOB, 1, ago=timedelta(0)), array_id=7)], 2, [0, 1, 1, 2]),
])
def test_members_held_by_their_arrays_limit_start_as_members_end(label, held_jobs, limit, expected):
    """Four 1-GPU members of array 7 on a free 8-GPU node, an hour each: the estimate keeps to the %K (the
    quotas leave room for all four)."""
    members = [member(i, 7) for i in range(1, 5)]
    arrays = {} if limit is None else {7: ArrayState(7, limit, len(held_jobs))}
    durations = {i: hours(1) for i in (100, 1, 2, 3, 4)}
    found = run(held_jobs, members, durations, groups_=groups(ph_quota=8, ph_user=8, held_jobs=held_jobs),
                arrays=arrays)
    assert [(found[i].start - NOW) / H for i in range(1, 5)] == expected, label
