"""Arrays and sweeps: the pure meaning of ``array`` and ``sweep`` (jobs.arrays), and the service that makes an
array and its members (jobs.services.arrays) in one transaction and a bounded number of queries."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.arrays import MEMBERS_MAX, ArrayError, array_plan, expand_sweep, member_env, member_name, parse_array
from jobs.choices import Phase
from jobs.models import Job, JobArray, JobEvent, SubmitKey
from jobs.services import job_spec_validate
from jobs.services.arrays import array_act, array_plan_validate, array_submit

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(("text", "indices", "limit"), [
    ("0-4", [0, 1, 2, 3, 4], None),
    ("1,3,5-7", [1, 3, 5, 6, 7], None),
    ("0-99%8", list(range(100)), 8),
    ("0-15:4", [0, 4, 8, 12], None),
    ("7", [7], None),
    ("3,1,1-2", [1, 2, 3], None),  # sorted, each index once
    (" 0 - 2 % 1 ", [0, 1, 2], 1),
    ("%2", [], 2),
])
def test_parse_array(text, indices, limit):
    assert parse_array(text) == (indices, limit)


@pytest.mark.parametrize(("text", "message"), [
    ("", "Give indices"),
    ("a-b", "'a-b' is not an index or range"),
    ("5-2", "ends before it starts"),
    ("0-9:0", "the step is 1 or more"),
    ("0-99%0", "the limit after % is a whole number of 1 or more"),
    ("0-99%x", "the limit after % is a whole number"),
    ("0-10000", "at most 10,000 members"),
    ("0-5000,6000-11000", "at most 10,000 members"),
    ("2000000", "indices go up to 1,000,000"),
    ("1,,2", "is not an index or range"),
    ("0-" + "9" * 300, "at most 200 characters"),
])
def test_parse_array_refuses(text, message):
    with pytest.raises(ArrayError, match=message) as info:
        parse_array(text)
    assert info.value.field == "array"


def test_a_sweep_expands_in_key_order_the_last_key_fastest():
    grid = expand_sweep({"lr": [1e-4, 3e-4], "bs": [32, 64]})
    assert grid == [{"lr": 1e-4, "bs": 32}, {"lr": 1e-4, "bs": 64}, {"lr": 3e-4, "bs": 32}, {"lr": 3e-4, "bs": 64}]
    assert [list(p) for p in grid] == [["lr", "bs"]] * 4


@pytest.mark.parametrize(("sweep", "message"), [
    ({}, "object of name"),
    ([1, 2], "object of name"),
    ({"lr": []}, "non-empty list"),
    ({"lr": 0.1}, "non-empty list"),
    ({"bad-name": [1]}, "not a sweep name"),
    ({"lr": [1], "LR": [2]}, "both SWEEP_LR"),
    ({"lr": [True]}, "strings or numbers"),
    ({"lr": [None]}, "strings or numbers"),
    ({"lr": [{"a": 1}]}, "strings or numbers"),
    ({"lr": [1, "1"]}, "twice"),
    ({"lr": ["a\nb"]}, "control characters"),
    ({"a": list(range(100)), "b": list(range(101))}, "at most 10,000 members"),
])
def test_expand_sweep_refuses(sweep, message):
    with pytest.raises(ArrayError, match=message) as info:
        expand_sweep(sweep)
    assert info.value.field == "sweep"


def test_a_sweep_of_exactly_the_maximum_is_allowed():
    assert len(expand_sweep({"a": list(range(100)), "b": list(range(MEMBERS_MAX // 100))})) == MEMBERS_MAX


def test_plans():
    plan = array_plan(array="0-2%2")
    assert (plan.indices, plan.max_running, plan.text, plan.sweep) == ((0, 1, 2), 2, "0-2%2", {})
    plan = array_plan(sweep={"lr": [1, 2]}, array="%1")
    assert (plan.indices, plan.params, plan.max_running, plan.text) == ((0, 1), ({"lr": 1}, {"lr": 2}), 1, "%1")
    assert array_plan(sweep={"lr": [1]}).max_running is None
    with pytest.raises(ArrayError, match="only a limit"):
        array_plan(sweep={"lr": [1]}, array="0-3")
    with pytest.raises(ArrayError, match="a limit alone goes with a sweep"):
        array_plan(array="%2")


def test_member_names_and_env():
    assert member_name("train", 7, {}) == "train[7]"
    assert member_name("train", 0, {"lr": 0.0001, "bs": 32}) == "train[lr=0.0001,bs=32]"
    long = member_name("x" * 128, 12, {})
    assert len(long) == 128 and long.endswith("[12]")
    assert member_name("t", 3, {"p": "v" * 200}) == "t[3]"  # parameters too long for a name: the index
    assert member_env({"A": "1"}, 5, 2, {"lr": 1e-4}) == {
        "A": "1", "JOB_ARRAY_ID": "5", "JOB_ARRAY_INDEX": "2", "SWEEP_LR": "0.0001"}


def spec_for(world, **extra):
    data = {"group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny", "command": "true",
            "name": "sweep", "env": {"A": "1"}, **extra}
    return job_spec_validate(user=world.users["bob"], data=data)


def test_a_sweep_makes_its_members_with_their_variables(world):
    spec = spec_for(world)
    plan = array_plan_validate(spec=spec, array="%2", sweep={"lr": [1e-4, 3e-4], "bs": [32, 64]})
    array = array_submit(user=world.users["bob"], spec=spec, plan=plan)
    array.refresh_from_db()
    assert (array.size, array.max_running, array.indices, array.group.name) == (4, 2, "%2", "phusers")
    members = list(Job.objects.filter(array=array).order_by("array_index"))
    assert [m.name for m in members] == ["sweep[lr=0.0001,bs=32]", "sweep[lr=0.0001,bs=64]",
                                         "sweep[lr=0.0003,bs=32]", "sweep[lr=0.0003,bs=64]"]
    assert [m.array_index for m in members] == [0, 1, 2, 3]
    assert members[3].array_params == {"lr": 3e-4, "bs": 64}
    assert members[3].env == {"A": "1", "JOB_ARRAY_ID": str(array.pk), "JOB_ARRAY_INDEX": "3",
                              "SWEEP_LR": "0.0003", "SWEEP_BS": "64"}
    assert {(m.phase, m.status, m.user.username) for m in members} == {(Phase.SUBMITTED, "Submitted", "bob")}
    events = JobEvent.objects.filter(job__array=array, reason="Submitted")
    assert events.count() == 4
    assert events.get(job=members[1]).message == f"Submitted by bob to phusers, member 1 of array {array.pk}"


def test_an_array_of_1000_costs_a_bounded_number_of_queries(world):
    spec = spec_for(world)
    plan = array_plan_validate(spec=spec, array="0-999%8", sweep=None)
    with CaptureQueriesContext(connection) as queries:
        array = array_submit(user=world.users["bob"], spec=spec, plan=plan, idempotency_key="k1", fingerprint="f")
    # The array, its members, their events, the expired keys and the key (in its savepoint): 5 statements.
    statements = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    assert len(statements) <= 5, statements
    assert Job.objects.filter(array=array).count() == 1000
    assert JobEvent.objects.filter(job__array=array).count() == 1000
    assert SubmitKey.objects.get(key="k1").job.array_index == 0


@pytest.mark.parametrize(("array", "sweep", "field"), [
    ("0-5%x", None, "array"),
    ("%3", None, "array"),
    ("0-3", {"lr": [1]}, "array"),
    (None, {"lr": []}, "sweep"),
    (None, {f"p{i}": [1] for i in range(100)}, "sweep"),  # with the job's variable, over the limit of 100
])
def test_bad_plans_are_field_errors_and_nothing_is_written(world, array, sweep, field):
    spec = spec_for(world)
    with pytest.raises(ValidationError) as info:
        array_plan_validate(spec=spec, array=array, sweep=sweep)
    assert field in info.value.message_dict
    assert not JobArray.objects.exists() and not Job.objects.exists()


def test_cancel_and_restart_failed_act_on_the_members_they_apply_to(world):
    spec = spec_for(world)
    array = array_submit(user=world.users["bob"], spec=spec, plan=array_plan_validate(spec=spec, array="0-3",
                                                                                       sweep=None))
    members = list(Job.objects.filter(array=array).order_by("array_index"))
    Job.objects.filter(pk=members[0].pk).update(phase=Phase.SUCCEEDED, status="Succeeded")
    Job.objects.filter(pk=members[1].pk).update(phase=Phase.FAILED, status="Fail")
    assert array_act(array=array, by=world.users["bob"], action="cancel") == {"done": 2, "skipped": 0}
    phases = dict(Job.objects.filter(array=array).values_list("array_index", "phase"))
    assert phases == {0: Phase.SUCCEEDED, 1: Phase.FAILED, 2: Phase.CANCELLED, 3: Phase.CANCELLED}
    with pytest.raises(ValidationError, match="no member left to cancel"):
        array_act(array=array, by=world.users["bob"], action="cancel")
    assert array_act(array=array, by=world.users["bob"], action="restart-failed") == {"done": 1, "skipped": 0}
    member = Job.objects.get(pk=members[1].pk)
    assert (member.phase, member.reason) == (Phase.PENDING, "Restarted")
    with pytest.raises(ValidationError, match="no failed member to restart"):
        array_act(array=array, by=world.users["bob"], action="restart-failed")
