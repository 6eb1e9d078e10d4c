"""The admission decision, table-driven over pure snapshots: no database."""

from datetime import datetime, timedelta

import pytest

from scheduler.core import GroupState, QueuedJob, QuotaLimits, Reason, Verdict, decide, fmt_amount
from scheduler.values import Node

T0 = datetime(2026, 1, 1)
BOB, PAN, LIN = 1, 2, 3
PH, RS = 10, 20


def job(id, user, gpu, group=PH, priority=50, replicas=1, at=None, cpu=0):
    return QueuedJob(id=id, name=f"j{id}", group_id=group, user_id=user, priority=priority,
                     queued_at=at or T0 + timedelta(seconds=id), replicas=replicas, request={"gpu": gpu, "cpu": cpu})


def groups(ph_quota=4, ph_user=4, rs_quota=8, rs_user=4, usage=None, user_usage=None, stopped=False):
    return {
        PH: GroupState(PH, "phusers", {"gpu": QuotaLimits(ph_quota, None, ph_user)}, dict(usage or {}),
                       {u: dict(v) for u, v in (user_usage or {}).items()}, queue_stopped=stopped),
        RS: GroupState(RS, "research", {"gpu": QuotaLimits(rs_quota, None, rs_user)}),
    }


def node(gpu=8, free=None):
    return Node("n1", {"gpu": gpu}, {"gpu": gpu if free is None else free}, list(range(gpu if free is None else free)))


CASES = [
    # (id, groups, jobs, nodes, expected {job: (verdict, reason, position)})
    ("primehub example 1: group quota holds the queue",
     groups(), [job(1, BOB, 2), job(2, PAN, 4), job(3, LIN, 2)], [node()],
     {1: ("admit", "Admitted", None), 2: ("wait", "GroupQuota", 1), 3: ("wait", "BlockedByQueueHead", 2)}),
    ("primehub example 2: user quota blocks no one",
     groups(), [job(1, BOB, 2), job(2, BOB, 4), job(3, LIN, 2)], [node()],
     {1: ("admit", "Admitted", None), 2: ("wait", "UserQuota", 1), 3: ("admit", "Admitted", None)}),
    ("user quota checked first even when the group quota would block too",
     groups(usage={"gpu": 3}, user_usage={BOB: {"gpu": 3}}), [job(1, BOB, 2), job(2, LIN, 1)], [node()],
     {1: ("wait", "UserQuota", 1), 2: ("admit", "Admitted", None)}),
    ("a blocked group never blocks another group",
     groups(), [job(1, BOB, 4), job(2, PAN, 2), job(3, LIN, 2, group=RS)], [node()],
     {1: ("admit", "Admitted", None), 2: ("wait", "GroupQuota", 1), 3: ("admit", "Admitted", None)}),
    ("capacity miss holds the group's queue, FIFO",
     groups(ph_quota=8, ph_user=8), [job(1, BOB, 4), job(2, PAN, 1)], [node(8, free=2)],
     {1: ("wait", "Capacity", 1), 2: ("wait", "BlockedByQueueHead", 2)}),
    ("larger than the user quota: inadmissible, blocks no one",
     groups(ph_user=2), [job(1, BOB, 4), job(2, PAN, 2)], [node()],
     {1: ("inadmissible", "ExceedsUserQuota", None), 2: ("admit", "Admitted", None)}),
    ("larger than the group quota: inadmissible",
     groups(ph_quota=2, ph_user=8), [job(1, BOB, 4)], [node()],
     {1: ("inadmissible", "ExceedsGroupQuota", None)}),
    ("larger than any node: inadmissible",
     groups(ph_quota=16, ph_user=16), [job(1, BOB, 12), job(2, PAN, 1)], [node(8)],
     {1: ("inadmissible", "NoNodeFits", None), 2: ("admit", "Admitted", None)}),
    ("replicas spread over two nodes",
     groups(ph_quota=16, ph_user=16), [job(1, BOB, 4, replicas=2)],
     [Node("a", {"gpu": 4}, {"gpu": 4}, [0, 1, 2, 3]), Node("b", {"gpu": 4}, {"gpu": 4}, [0, 1, 2, 3])],
     {1: ("admit", "Admitted", None)}),
    ("stopped queue: inadmissible",
     groups(stopped=True), [job(1, BOB, 1)], [node()],
     {1: ("inadmissible", "QueueStopped", None)}),
    ("priority goes before submission time",
     groups(), [job(1, BOB, 4), job(2, PAN, 4, priority=100)], [node()],
     {2: ("admit", "Admitted", None), 1: ("wait", "GroupQuota", 1)}),
    ("no quota row: unlimited",
     {PH: GroupState(PH, "phusers")}, [job(1, BOB, 6)], [node()],
     {1: ("admit", "Admitted", None)}),
    ("no nodes given: capacity not checked",
     groups(ph_quota=64, ph_user=64), [job(1, BOB, 32)], [],
     {1: ("admit", "Admitted", None)}),
    ("zero-GPU jobs pass a full GPU quota",
     groups(usage={"gpu": 4}), [job(1, BOB, 0, cpu=500)], [node(8, free=4)],
     {1: ("admit", "Admitted", None)}),
    # Admission by queue heads: once a job holds its group's queue, the jobs behind it are not looked at.
    ("behind a held head, a user quota miss is not looked at: it waits behind the head",
     groups(usage={"gpu": 4}, user_usage={BOB: {"gpu": 4}}), [job(1, PAN, 2), job(2, BOB, 1)], [node()],
     {1: ("wait", "GroupQuota", 1), 2: ("wait", "BlockedByQueueHead", 2)}),
    ("a user quota miss is skipped past up to the head; behind the head even a job that fits waits",
     groups(ph_quota=8, usage={"gpu": 4}, user_usage={BOB: {"gpu": 4}}),
     [job(1, BOB, 1), job(2, PAN, 2), job(3, LIN, 4), job(4, BOB, 1), job(5, PAN, 1)], [node()],
     {1: ("wait", "UserQuota", 1), 2: ("admit", "Admitted", None), 3: ("wait", "GroupQuota", 2),
      4: ("wait", "BlockedByQueueHead", 3), 5: ("wait", "BlockedByQueueHead", 4)}),
    ("a job that can never fit is inadmissible even behind a held head",
     groups(ph_user=2, usage={"gpu": 4}), [job(1, PAN, 2), job(2, BOB, 4), job(3, LIN, 1)], [node()],
     {1: ("wait", "GroupQuota", 1), 2: ("inadmissible", "ExceedsUserQuota", None),
      3: ("wait", "BlockedByQueueHead", 2)}),
    ("a requeued job behind a held head waits behind it, not for its delay",
     groups(usage={"gpu": 4}), [job(1, PAN, 2), QueuedJob(2, "j2", PH, BOB, 50, T0 + timedelta(seconds=2), 1,
                                                        {"gpu": 1}, not_before=T0 + timedelta(days=1))], [node()],
     {1: ("wait", "GroupQuota", 1), 2: ("wait", "BlockedByQueueHead", 2)}),
]


@pytest.mark.parametrize("groups_, jobs, nodes, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(groups_, jobs, nodes, expected):
    outcomes = {o.job_id: o for o in decide(groups_, jobs, nodes)}
    got = {jid: (str(o.verdict), str(o.reason), o.position) for jid, o in outcomes.items()}
    assert got == expected


def test_decide_does_not_mutate_its_input():
    g = groups()
    n = [node()]
    decide(g, [job(1, BOB, 2)], n)
    assert g[PH].usage == {} and n[0].free == {"gpu": 8} and n[0].free_gpu_ids == list(range(8))


def test_admitted_jobs_get_distinct_gpus():
    busy_0_1 = Node("n1", {"gpu": 8}, {"gpu": 6}, [2, 3, 4, 5, 6, 7])
    outcomes = decide(groups(ph_quota=8, ph_user=8), [job(1, BOB, 2), job(2, PAN, 2)], [busy_0_1])
    ids = [o.placement[0].gpu_ids for o in outcomes]
    assert ids == [(2, 3), (4, 5)]


def test_jobs_behind_a_head_name_it_and_what_it_waits_for():
    outcomes = {o.job_id: o for o in decide(groups(usage={"gpu": 4}), [job(1, PAN, 2), job(2, LIN, 1)], [node()])}
    assert outcomes[2].message == "behind job #1 (j1), which waits for group quota"


def test_each_replica_goes_to_the_fullest_node_that_holds_it():
    nodes = [Node("a", {"gpu": 8}, {"gpu": 8}, list(range(8))), Node("b", {"gpu": 8}, {"gpu": 3}, [5, 6, 7]),
             Node("c", {"gpu": 8}, {"gpu": 2}, [6, 7])]
    outcomes = decide(groups(ph_quota=16, ph_user=16), [job(1, BOB, 2), job(2, PAN, 2), job(3, LIN, 4)], nodes)
    assert [[(p.node, p.gpu_ids) for p in o.placement] for o in outcomes] == [
        [("c", (6, 7))], [("b", (5, 6))], [("a", (0, 1, 2, 3))]]


def test_a_job_whose_last_replica_finds_no_room_takes_nothing():
    nodes = [Node("a", {"gpu": 4}, {"gpu": 4}, [0, 1, 2, 3]), Node("b", {"gpu": 4}, {"gpu": 2}, [2, 3])]
    outcomes = {o.job_id: o for o in decide(groups(ph_quota=16, ph_user=16),
                                            [job(1, BOB, 4, replicas=2), job(2, PAN, 4, group=RS)], nodes)}
    assert (outcomes[1].reason, outcomes[2].reason) == (Reason.CAPACITY, Reason.ADMITTED)
    assert [(p.node, p.gpu_ids) for p in outcomes[2].placement] == [("a", (0, 1, 2, 3))]


def test_many_nodes_are_filled_without_handing_out_a_gpu_twice():
    nodes = [Node(f"n{i}", {"gpu": 8}, {"gpu": 8}, list(range(8))) for i in range(50)]
    jobs = [job(i, BOB, 1 + i % 4, group=PH if i % 2 else RS) for i in range(1, 400)]
    big = {gid: GroupState(gid, name) for gid, name in ((PH, "phusers"), (RS, "research"))}
    outcomes = decide(big, jobs, nodes)
    taken = [(o.placement[0].node, g) for o in outcomes if o.verdict == Verdict.ADMIT for g in o.placement[0].gpu_ids]
    assert len(taken) == len(set(taken)) == 400  # all 50 × 8 GPUs, each once
    assert all(o.reason in (Reason.ADMITTED, Reason.CAPACITY, Reason.BLOCKED) for o in outcomes)


def test_messages_carry_numbers():
    outcomes = {o.job_id: o for o in decide(groups(), [job(1, BOB, 2), job(2, PAN, 4)], [node()])}
    assert outcomes[2].message == "waiting for group GPU quota of phusers: 2 GPU used of 4 GPU, asks 4 GPU"
    assert outcomes[1].verdict == Verdict.ADMIT and outcomes[2].reason == Reason.GROUP_QUOTA


@pytest.mark.parametrize("resource, amount, text", [
    ("gpu", 4, "4 GPU"), ("cpu", 8000, "8 CPU"), ("cpu", 250, "250m CPU"), ("memory", 32 << 30, "32 GiB"),
    ("gpu", None, "unlimited"),
])
def test_fmt_amount(resource, amount, text):
    assert fmt_amount(resource, amount) == text


# --- priority, preemption and over-quota (rule 6) -------------------------------------------------------------

from scheduler.core import ReplicaPlacement, RunningJob  # noqa: E402

pytestmark = pytest.mark.fast


def running(id, gpu, group=PH, priority=0, preemptible=True, age=0, over_quota=False, terminating=False, ids=()):
    return RunningJob(id=id, name=f"r{id}", group_id=group, priority=priority, preemptible=preemptible, replicas=1,
                      request={"gpu": gpu}, admitted_at=T0 - timedelta(seconds=age), over_quota=over_quota,
                      terminating=terminating, placement=(ReplicaPlacement("n1", tuple(ids)),) if ids else ())


def decided(groups_, jobs, nodes, run):
    return {o.job_id: (str(o.verdict), str(o.reason)) for o in decide(groups_, jobs, nodes, run)}


PREEMPTION_CASES = [
    ("high evicts a low preemptible job of its group",
     groups(usage={"gpu": 4}), [job(1, BOB, 4, priority=100)], [], [running(9, 4)],
     {1: ("wait", "Preempting"), 9: ("preempt", "Preempted")}),
    ("a non-preemptible job is never evicted",
     groups(usage={"gpu": 4}), [job(1, BOB, 4, priority=100)], [], [running(9, 4, preemptible=False)],
     {1: ("wait", "GroupQuota")}),
    ("equal priority evicts no one",
     groups(usage={"gpu": 4}), [job(1, BOB, 4, priority=0)], [], [running(9, 4, priority=0)],
     {1: ("wait", "GroupQuota")}),
    ("other groups' jobs are not evicted for group quota",
     groups(usage={"gpu": 4}), [job(1, BOB, 4, priority=100)], [], [running(9, 4, group=RS)],
     {1: ("wait", "GroupQuota")}),
    ("victims: lowest priority, then newest, no more than needed",
     groups(ph_quota=6, ph_user=6, usage={"gpu": 6}), [job(1, BOB, 2, priority=100)], [],
     [running(7, 2, age=100), running(8, 2, age=10), running(9, 2, priority=50, age=1)],
     {1: ("wait", "Preempting"), 8: ("preempt", "Preempted")}),
    ("jobs already terminating are waited for, not doubled",
     groups(usage={"gpu": 4}), [job(1, BOB, 4, priority=100)], [], [running(9, 4, terminating=True)],
     {1: ("wait", "GroupQuota")}),
    ("a preemptible job may borrow up to the limit on idle resources",
     {PH: GroupState(PH, "phusers", {"gpu": QuotaLimits(2, 6, 8)})}, [
         QueuedJob(1, "j1", PH, BOB, 50, T0, 1, {"gpu": 4}, preemptible=True)], [node()], [],
     {1: ("admit", "Admitted")}),
    ("a non-preemptible job never runs over quota",
     {PH: GroupState(PH, "phusers", {"gpu": QuotaLimits(2, 6, 8)})}, [job(1, BOB, 4)], [node()], [],
     {1: ("inadmissible", "ExceedsGroupQuota")}),
]


@pytest.mark.parametrize("groups_, jobs, nodes, run, expected", [c[1:] for c in PREEMPTION_CASES],
                         ids=[c[0] for c in PREEMPTION_CASES])
def test_preemption(groups_, jobs, nodes, run, expected):
    assert decided(groups_, jobs, nodes, run) == expected


def test_over_quota_admission_is_marked():
    g = {PH: GroupState(PH, "phusers", {"gpu": QuotaLimits(2, 6, 8)})}
    borrow = QueuedJob(1, "j1", PH, BOB, 50, T0, 1, {"gpu": 4}, preemptible=True)
    [outcome] = decide(g, [borrow], [node()])
    assert outcome.over_quota and "over its group's quota" in outcome.message


def test_reclaim_evicts_another_groups_over_quota_job_for_guaranteed_quota():
    g = {
        PH: GroupState(PH, "phusers", {"gpu": QuotaLimits(4, 8, 8)}, {"gpu": 8}),
        RS: GroupState(RS, "research", {"gpu": QuotaLimits(4, None, 4)}),
    }
    run = [running(8, 4, age=50, ids=(0, 1, 2, 3)), running(9, 4, over_quota=True, age=10, ids=(4, 5, 6, 7))]
    outcomes = {o.job_id: o for o in decide(g, [job(1, LIN, 4, group=RS)], [node(8, free=0)], run)}
    assert (outcomes[9].verdict, outcomes[9].by) == (Verdict.PREEMPT, 1)
    assert "guaranteed quota" in outcomes[9].message
    assert 8 not in outcomes and outcomes[1].reason == Reason.PREEMPTING


def test_over_quota_job_cannot_reclaim():
    g = {
        PH: GroupState(PH, "phusers", {"gpu": QuotaLimits(4, 8, 8)}, {"gpu": 4}),
        RS: GroupState(RS, "research", {"gpu": QuotaLimits(4, 8, 8)}, {"gpu": 4}),
    }
    run = [running(9, 4, group=RS, over_quota=True, ids=(4, 5, 6, 7)), running(8, 4, priority=50, ids=(0, 1, 2, 3))]
    borrow = QueuedJob(1, "j1", PH, BOB, 50, T0, 1, {"gpu": 4}, preemptible=True)
    assert decided(g, [borrow], [node(8, free=0)], run) == {1: ("wait", "Capacity")}


# --- nomination: what a preemptor's victims free is reserved for it --------------------------------------------


def reclaim_groups(ph_usage=0, rs_usage=0):
    """phusers may borrow up to 8 GPUs over its quota of 4; research is guaranteed 4."""
    return {
        PH: GroupState(PH, "phusers", {"gpu": QuotaLimits(4, 8, 8)}, {"gpu": ph_usage}),
        RS: GroupState(RS, "research", {"gpu": QuotaLimits(4, None, 4)}, {"gpu": rs_usage}),
    }


def borrower(id, gpu=4, at=None):
    return QueuedJob(id, f"j{id}", PH, BOB, 50, at or T0 + timedelta(seconds=id), 1, {"gpu": gpu}, preemptible=True)


def nominated(job_):
    return QueuedJob(**{**job_.__dict__, "nominated": True})


NOMINATION_CASES = [
    ("the evicted borrower, queued earlier, does not take back what its preemptor is owed",
     reclaim_groups(ph_usage=4), [borrower(2, at=T0), nominated(job(5, LIN, 4, group=RS))], [node(8, free=4)],
     [running(8, 4, preemptible=False, ids=(0, 1, 2, 3))],
     {5: ("admit", "Admitted"), 2: ("wait", "Capacity")}),
    ("a nominated job waiting for its victims keeps its nomination",
     reclaim_groups(ph_usage=8), [nominated(job(5, LIN, 4, group=RS))], [node(8, free=0)],
     [running(8, 4, ids=(0, 1, 2, 3)), running(9, 4, over_quota=True, terminating=True, ids=(4, 5, 6, 7))],
     {5: ("wait", "Preempting")}),
    ("what is already free of its room is reserved: a later small job does not take it",
     reclaim_groups(ph_usage=6), [nominated(job(5, LIN, 4, group=RS)), borrower(6, gpu=2)],
     [Node("n1", {"gpu": 8}, {"gpu": 2}, [6, 7])],
     [running(7, 2, preemptible=False, ids=(0, 1)), running(8, 2, preemptible=False, ids=(2, 3)),
      running(9, 2, over_quota=True, terminating=True, ids=(4, 5))],
     {5: ("wait", "Preempting"), 6: ("wait", "Capacity")}),
    ("in the pass that preempts, what is already free of the preemptor's room is reserved too",
     reclaim_groups(ph_usage=6), [job(5, LIN, 4, group=RS), borrower(6, gpu=2)],
     [Node("n1", {"gpu": 8}, {"gpu": 2}, [6, 7])],
     [running(7, 2, preemptible=False, ids=(0, 1)), running(8, 2, preemptible=False, ids=(2, 3)),
      running(9, 2, over_quota=True, ids=(4, 5))],
     {5: ("wait", "Preempting"), 9: ("preempt", "Preempted"), 6: ("wait", "Capacity")}),
    ("a nominated job that can no longer get room gives up its nomination",
     reclaim_groups(ph_usage=8), [nominated(job(5, LIN, 4, group=RS))], [node(8, free=0)],
     [running(8, 8, preemptible=False, ids=tuple(range(8)))],
     {5: ("wait", "Capacity")}),
]


@pytest.mark.parametrize("groups_, jobs, nodes, run, expected", [c[1:] for c in NOMINATION_CASES],
                         ids=[c[0] for c in NOMINATION_CASES])
def test_nomination(groups_, jobs, nodes, run, expected):
    assert decided(groups_, jobs, nodes, run) == expected


def test_two_groups_reclaim_in_one_pass_each_from_its_own_victims():
    """The room one reclaimer's victims free is promised to it: a second reclaimer of the same pass does not count
    on it (and wait), it preempts for itself."""
    XG = 30
    g = {
        PH: GroupState(PH, "phusers", {"gpu": QuotaLimits(0, 8, 8)}, {"gpu": 8}),
        RS: GroupState(RS, "research", {"gpu": QuotaLimits(4, None, 4)}),
        XG: GroupState(XG, "vision", {"gpu": QuotaLimits(4, None, 4)}),
    }
    run = [running(8, 4, over_quota=True, age=50, ids=(0, 1, 2, 3)),
           running(9, 4, over_quota=True, age=10, ids=(4, 5, 6, 7))]
    jobs = [job(1, LIN, 4, group=RS), job(2, BOB, 4, group=XG)]
    outcomes = {o.job_id: o for o in decide(g, jobs, [node(8, free=0)], run)}
    assert {i: (str(o.verdict), str(o.reason)) for i, o in outcomes.items()} == {
        1: ("wait", "Preempting"), 2: ("wait", "Preempting"), 8: ("preempt", "Preempted"), 9: ("preempt", "Preempted")}
    assert (outcomes[9].by, outcomes[8].by) == (1, 2)

    # The next pass, both victims still terminating: each nominated job waits for its own; a third group's job
    # does not count on their room (promised) and preempts for itself.
    YG = 40
    g[YG] = GroupState(YG, "speech", {"gpu": QuotaLimits(4, None, 4)})
    g[PH] = GroupState(PH, "phusers", {"gpu": QuotaLimits(0, 12, 12)}, {"gpu": 12})
    run = [running(8, 4, over_quota=True, terminating=True, ids=(0, 1, 2, 3)),
           running(9, 4, over_quota=True, terminating=True, ids=(4, 5, 6, 7)),
           RunningJob(id=10, name="r10", group_id=PH, priority=0, preemptible=True, replicas=1, request={"gpu": 4},
                      admitted_at=T0, over_quota=True, placement=(ReplicaPlacement("n2", (0, 1, 2, 3)),))]
    nodes = [node(8, free=0), Node("n2", {"gpu": 4}, {"gpu": 0}, [])]
    later = [nominated(job(1, LIN, 4, group=RS)), nominated(job(2, BOB, 4, group=XG)), job(3, PAN, 4, group=YG)]
    assert decided(g, later, nodes, run) == {
        1: ("wait", "Preempting"), 2: ("wait", "Preempting"), 3: ("wait", "Preempting"), 10: ("preempt", "Preempted")}


def test_a_pass_never_evicts_and_readmits_the_same_job():
    """Pass after pass, a reclaim converges: one eviction, the owed job runs, the borrower waits."""
    g = reclaim_groups(ph_usage=8)
    run = [running(8, 4, preemptible=False, ids=(0, 1, 2, 3)), running(9, 4, over_quota=True, ids=(4, 5, 6, 7))]
    owed = job(5, LIN, 4, group=RS)
    outcomes = {o.job_id: o for o in decide(g, [owed], [node(8, free=0)], run)}
    assert (outcomes[9].verdict, outcomes[5].reason) == (Verdict.PREEMPT, Reason.PREEMPTING)
    # Job 9 has terminated and is queued again, before the owed job; the owed job is nominated.
    g = reclaim_groups(ph_usage=4)
    again = borrower(9, at=T0 - timedelta(hours=1))
    outcomes = {o.job_id: o for o in decide(g, [again, nominated(owed)], [node(8, free=4)], run[:1])}
    assert outcomes[5].verdict == Verdict.ADMIT and "freed by the jobs it preempted" in outcomes[5].message
    assert outcomes[9].verdict == Verdict.WAIT and not any(o.verdict == Verdict.PREEMPT for o in outcomes.values())


def test_a_preemptible_job_held_at_its_groups_limit_says_limit():
    g = {PH: GroupState(PH, "phusers", {"gpu": QuotaLimits(4, 8, 8)}, {"gpu": 8}, {PAN: {"gpu": 8}})}
    [outcome] = decide(g, [borrower(1, gpu=2)], [])
    assert outcome.message == "waiting for group GPU limit of phusers: 8 GPU used of 8 GPU, asks 2 GPU"
    [outcome] = decide(g, [job(2, BOB, 2)], [])
    assert outcome.message.startswith("waiting for group GPU quota of phusers: 8 GPU used of 4 GPU")
