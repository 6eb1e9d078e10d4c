"""An array's ``%K`` limit: at most K of its members hold resources at once. Table tests of the pure decision,
the pass's snapshot of the arrays' limits (one query), and an array of 5 with %2 end to end on the local backend."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.arrays import array_plan
from jobs.choices import RESOURCE_PHASES, Phase
from jobs.models import Job
from jobs.services import job_spec_validate
from jobs.services.arrays import array_submit
from scheduler.core import ArrayState, GroupState, QueuedJob, QuotaLimits, decide
from scheduler.snapshot import array_limits
from scheduler.values import Node

T0 = datetime(2026, 1, 1)
BOB, PAN = 1, 2
PH, RS = 10, 20
A, B = 100, 200


def job(id, gpu=1, user=BOB, group=PH, array=None, priority=50):
    return QueuedJob(id=id, name=f"j{id}", group_id=group, user_id=user, priority=priority,
                     queued_at=T0 + timedelta(seconds=id), replicas=1, request={"gpu": gpu}, array_id=array)


def groups(quota=8, user_quota=8):
    return {PH: GroupState(PH, "phusers", {"gpu": QuotaLimits(quota, None, user_quota)}),
            RS: GroupState(RS, "research", {"gpu": QuotaLimits(8, None, 8)})}


def node(gpu=8):
    return Node("n1", {"gpu": gpu}, {"gpu": gpu}, list(range(gpu)))


CASES = [
    # (id, groups, jobs, arrays, nodes, expected {job: (verdict, reason, position)})
    ("no limit: every member is admitted",
     groups(), [job(i, array=A) for i in range(1, 5)], {}, [node()],
     {i: ("admit", "Admitted", None) for i in range(1, 5)}),
    ("%2 with none holding: the first two are admitted, the others wait",
     groups(), [job(i, array=A) for i in range(1, 5)], {A: ArrayState(A, 2, 0)}, [node()],
     {1: ("admit", "Admitted", None), 2: ("admit", "Admitted", None), 3: ("wait", "ArrayLimit", 1),
      4: ("wait", "ArrayLimit", 2)}),
    ("%2 with one holding: one more is admitted",
     groups(), [job(i, array=A) for i in range(1, 4)], {A: ArrayState(A, 2, 1)}, [node()],
     {1: ("admit", "Admitted", None), 2: ("wait", "ArrayLimit", 1), 3: ("wait", "ArrayLimit", 2)}),
    ("%2 with two holding: every member waits",
     groups(), [job(1, array=A)], {A: ArrayState(A, 2, 2)}, [node()],
     {1: ("wait", "ArrayLimit", 1)}),
    ("a member over its limit does not hold its group's queue: later jobs pass it",
     groups(), [job(1, array=A), job(2, array=A), job(3, array=A), job(4, user=PAN)], {A: ArrayState(A, 2, 0)},
     [node()],
     {1: ("admit", "Admitted", None), 2: ("admit", "Admitted", None), 3: ("wait", "ArrayLimit", 1),
      4: ("admit", "Admitted", None)}),
    ("each array has its own limit",
     groups(), [job(1, array=A), job(2, array=B), job(3, array=A), job(4, array=B)],
     {A: ArrayState(A, 1, 0), B: ArrayState(B, 1, 0)}, [node()],
     {1: ("admit", "Admitted", None), 2: ("admit", "Admitted", None), 3: ("wait", "ArrayLimit", 1),
      4: ("wait", "ArrayLimit", 2)}),
    ("a member that waits for group quota holds the queue as any job",
     groups(quota=1), [job(1, array=A), job(2, array=A), job(3, user=PAN)], {A: ArrayState(A, 2, 0)}, [node()],
     {1: ("admit", "Admitted", None), 2: ("wait", "GroupQuota", 1), 3: ("wait", "BlockedByQueueHead", 2)}),
    ("behind a held head a member waits behind it, not for its array",
     groups(quota=1), [job(1, user=PAN), job(2, user=PAN), job(3, array=A)], {A: ArrayState(A, 1, 1)}, [node()],
     {1: ("admit", "Admitted", None), 2: ("wait", "GroupQuota", 1), 3: ("wait", "BlockedByQueueHead", 2)}),
    ("a member that never fits is inadmissible, whatever its array",
     groups(), [job(1, gpu=16, array=A)], {A: ArrayState(A, 1, 1)}, [node()],
     {1: ("inadmissible", "ExceedsUserQuota", None)}),
    ("a member not admitted (capacity) is not counted against its array",
     groups(), [job(1, gpu=8, array=A), job(2, gpu=1, user=PAN, group=RS)], {A: ArrayState(A, 1, 0)},
     [node(gpu=4)],
     {1: ("inadmissible", "NoNodeFits", None), 2: ("admit", "Admitted", None)}),
]


@pytest.mark.fast
@pytest.mark.parametrize(("groups_", "jobs", "arrays", "nodes", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_array_limit(groups_, jobs, arrays, nodes, expected):
    outcomes = {o.job_id: o for o in decide(groups_, jobs, nodes, arrays=arrays, now=T0)}
    assert {i: (o.verdict.value, o.reason.value, o.position) for i, o in outcomes.items()} == expected
    of = {j.id: j.array_id for j in jobs}
    for o in outcomes.values():
        if o.reason == "ArrayLimit":
            assert o.message == f"array {of[o.job_id]} runs at most {arrays[of[o.job_id]].max_running} at once"


def submit_array(world, text, command="echo $JOB_ARRAY_INDEX", instance_type="cpu-tiny"):
    user = world.users["bob"]
    spec = job_spec_validate(user=user, data={"group": "phusers", "image": "base-notebook", "name": "arr",
                                              "instance_type": instance_type, "command": command})
    return array_submit(user=user, spec=spec, plan=array_plan(array=text))


@pytest.mark.fast
@pytest.mark.django_db
def test_the_snapshot_reads_every_limited_arrays_holding_in_one_query(world):
    limited, other, free = submit_array(world, "0-4%2"), submit_array(world, "0-2%1"), submit_array(world, "0-1")
    members = list(Job.objects.filter(array=limited).order_by("array_index"))
    Job.objects.filter(pk__in=[members[0].pk]).update(phase=Phase.RUNNING)
    Job.objects.filter(pk__in=[members[1].pk]).update(phase=Phase.UNKNOWN)
    Job.objects.filter(pk__in=[members[2].pk]).update(phase=Phase.SUCCEEDED)
    with CaptureQueriesContext(connection) as queries:
        found = array_limits({limited.pk, other.pk, free.pk})
    assert len(queries) == 1
    assert found == {limited.pk: ArrayState(limited.pk, 2, 2), other.pk: ArrayState(other.pk, 1, 0)}


@pytest.mark.django_db
def test_an_array_of_5_with_2_at_once_runs_2_at_a_time_and_each_logs_its_index(world, clock):
    from scheduler.backend_factory import get_backend
    from tests import waiting

    array = submit_array(world, "0-4%2", command="echo index=$JOB_ARRAY_INDEX of $JOB_ARRAY_ID; sleep 0.3")
    most = 0

    def all_done() -> bool:
        nonlocal most
        clock()
        holding = Job.objects.filter(array=array, phase__in=RESOURCE_PHASES).count()
        most = max(most, holding)
        assert holding <= 2
        return not Job.objects.filter(array=array).exclude(phase=Phase.SUCCEEDED).exists()

    first = Job.objects.filter(array=array).order_by("array_index").first()
    clock()
    first.refresh_from_db()
    waiting_members = Job.objects.filter(array=array, phase=Phase.PENDING, reason="ArrayLimit")
    assert waiting_members.count() == 3
    assert waiting_members.first().message == f"array {array.pk} runs at most 2 at once"

    waiting.wait_for(all_done, timeout=90, message=lambda: str(list(
        Job.objects.filter(array=array).values_list("array_index", "phase", "reason"))))
    assert most == 2
    backend = get_backend()
    for member in Job.objects.filter(array=array).order_by("array_index"):
        log = backend.log_path(job_id=member.pk, attempt_number=1, rank=0).read_text()
        assert f"index={member.array_index} of {array.pk}" in log
