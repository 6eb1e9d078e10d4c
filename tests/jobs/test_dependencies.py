"""Dependencies between jobs: the pure decisions (reading ``after``, met / never / not yet, cycles) as tables, and
the services that record them at submit and settle them when a job ends (no scheduler, no process)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import selectors, services
from jobs.choices import DependencyWhen, Phase
from jobs.dependencies import (
    After,
    AfterInvalid,
    State,
    after_from_text,
    after_parse,
    dependency_state,
    find_cycle,
    never_event_message,
    never_message,
    waits_message,
)
from jobs.models import Job, JobArray, JobDependency
from jobs.services.dependencies import dependencies_record, dependents_on_end

pytestmark = pytest.mark.fast

P = Phase
OK, NOTOK, ANY = DependencyWhen.OK, DependencyWhen.NOTOK, DependencyWhen.ANY

# --- dependency_state: one named row per case -------------------------------------------------------------------

STATE_CASES = [
    # (name, when, phases of the job or of every member of the array, expected)
    ("ok: running is not decided", OK, [P.RUNNING], State.WAITING),
    ("ok: pending is not decided", OK, [P.PENDING], State.WAITING),
    ("ok: backoff (a retry to come) is not decided", OK, [P.BACKOFF], State.WAITING),
    ("ok: succeeded is met", OK, [P.SUCCEEDED], State.MET),
    ("ok: failed can never be met", OK, [P.FAILED], State.NEVER),
    ("ok: cancelled can never be met", OK, [P.CANCELLED], State.NEVER),
    ("ok: timed out can never be met", OK, [P.TIMED_OUT], State.NEVER),
    ("ok: preempted can never be met", OK, [P.PREEMPTED], State.NEVER),
    ("notok: failed is met", NOTOK, [P.FAILED], State.MET),
    ("notok: cancelled is met", NOTOK, [P.CANCELLED], State.MET),
    ("notok: succeeded can never be met", NOTOK, [P.SUCCEEDED], State.NEVER),
    ("notok: running is not decided", NOTOK, [P.RUNNING], State.WAITING),
    ("any: succeeded is met", ANY, [P.SUCCEEDED], State.MET),
    ("any: failed is met", ANY, [P.FAILED], State.MET),
    ("any: unknown (still holding) is not decided", ANY, [P.UNKNOWN], State.WAITING),
    ("array ok: all succeeded is met", OK, [P.SUCCEEDED] * 3, State.MET),
    ("array ok: one still running is not decided", OK, [P.SUCCEEDED, P.FAILED, P.RUNNING], State.WAITING),
    ("array ok: all ended, one failed, never", OK, [P.SUCCEEDED, P.FAILED, P.SUCCEEDED], State.NEVER),
    ("array notok: all ended, one failed, met", NOTOK, [P.SUCCEEDED, P.FAILED], State.MET),
    ("array notok: all succeeded, never", NOTOK, [P.SUCCEEDED, P.SUCCEEDED], State.NEVER),
    ("array any: all ended is met", ANY, [P.CANCELLED, P.SUCCEEDED], State.MET),
    ("array any: one queued is not decided", ANY, [P.CANCELLED, P.SUBMITTED], State.WAITING),
]


@pytest.mark.parametrize("when, phases, expected", [c[1:] for c in STATE_CASES], ids=[c[0] for c in STATE_CASES])
def test_dependency_state(when, phases, expected):
    assert dependency_state(when, phases) == expected


# --- after_parse ---------------------------------------------------------------------------------------------

PARSE_CASES = [
    ("when defaults to ok", [{"job": 12}], (After("job", 12, OK),)),
    ("jobs and arrays", [{"job": 12, "when": "notok"}, {"array": 5, "when": "any"}],
     (After("job", 12, NOTOK), After("array", 5, ANY))),
    ("nothing", None, ()),
    ("an empty list", [], ()),
]


@pytest.mark.parametrize("value, expected", [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_after_parse(value, expected):
    assert after_parse(value) == expected


BAD_CASES = [
    ("not a list", {"job": 12}, "Give a list"),
    ("an item not an object", [12], "Dependency 1: give an object"),
    ("an unknown key", [{"job": 1, "after": "ok"}], "unknown key 'after'"),
    ("neither job nor array", [{"when": "ok"}], "either a job or an array"),
    ("both job and array", [{"job": 1, "array": 2}], "either a job or an array"),
    ("a string id", [{"job": "12"}], "positive whole number"),
    ("a boolean id", [{"job": True}], "positive whole number"),
    ("id zero", [{"job": 0}], "positive whole number"),
    ("a bad when", [{"job": 1}, {"job": 2, "when": "afterok"}], "Dependency 2: when must be ok, notok or any"),
    ("a duplicate", [{"job": 3}, {"job": 3, "when": "any"}], "Job 3 is listed twice"),
    ("too many", [{"job": n} for n in range(1, 102)], "at most 100"),
]


@pytest.mark.parametrize("value, message", [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_after_parse_names_what_is_wrong(value, message):
    with pytest.raises(AfterInvalid, match=message):
        after_parse(value)


def test_after_from_text_reads_the_short_form():
    assert after_from_text("12, 13:any; array/5:notok,,") == [
        {"job": 12, "when": "ok"}, {"job": 13, "when": "any"}, {"array": 5, "when": "notok"}]
    assert after_from_text("  ") == []
    with pytest.raises(AfterInvalid, match="'x12' is not a dependency"):
        after_from_text("x12")


# --- find_cycle: real cycles ----------------------------------------------------------------------------------

CYCLE_CASES = [
    ("no edges", {"a": []}, None),
    ("a chain", {"a": ["b"], "b": ["c"], "c": []}, None),
    ("a diamond is no cycle", {"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}, None),
    ("a node waiting for itself", {"a": ["a"]}, ["a", "a"]),
    ("two waiting for each other", {"a": ["b"], "b": ["a"]}, ["a", "b", "a"]),
    ("a cycle behind a chain", {"x": ["a"], "a": ["b"], "b": ["c"], "c": ["a"]}, ["a", "b", "c", "a"]),
    ("a job and an array", {("job", 1): [("array", 2)], ("array", 2): [("job", 1)]},
     [("job", 1), ("array", 2), ("job", 1)]),
    ("nodes missing as keys wait for nothing", {"a": ["b"], "c": ["b"]}, None),
]


@pytest.mark.parametrize("graph, expected", [c[1:] for c in CYCLE_CASES], ids=[c[0] for c in CYCLE_CASES])
def test_find_cycle(graph, expected):
    assert find_cycle(graph) == expected


def test_find_cycle_follows_a_long_chain_without_recursion():
    graph = {n: [n + 1] for n in range(5000)}
    assert find_cycle(graph) is None
    graph[5000] = [0]
    cycle = find_cycle(graph)
    assert cycle[0] == cycle[-1] and len(cycle) == 5002


def test_messages_name_the_dependency():
    assert waits_message([("job", 12, OK)]) == "Waits for job 12 to succeed"
    assert (waits_message([("job", 12, OK), ("job", 13, ANY), ("array", 5, NOTOK)])
            == "Waits for job 12 to succeed, job 13 to end and array 5 to end with a job that did not succeed")
    assert never_message("job", 12, OK, [P.FAILED]) == "job 12 has already failed; it can never succeed"
    assert (never_message("job", 12, NOTOK, [P.SUCCEEDED])
            == "job 12 has already succeeded; it can never end without succeeding")
    assert (never_event_message("array", 5, OK, [P.SUCCEEDED, P.FAILED])
            == "Waited for every job of array 5 to succeed, which can never happen: array 5 ended with a job that "
               "did not succeed")


# --- the services --------------------------------------------------------------------------------------------


def end(job: Job, phase: str) -> Job:
    """Drive ``job`` to an end through the state machine, as the scheduler would."""
    job.refresh_from_db()
    if job.phase == P.SUBMITTED:
        services.job_transition(job=job, phase=P.PENDING, reason="Queued")
    if phase != P.CANCELLED:
        services.job_transition(job=job, phase=P.PREPARING)
        services.job_transition(job=job, phase=P.RUNNING)
        services.job_transition(job=job, phase=phase, reason="Error" if phase == P.FAILED else "Completed",
                                exit_code=0 if phase == P.SUCCEEDED else 1)
    else:
        services.job_transition(job=job, phase=P.CANCELLED, reason="CancelledByUser")
    job.refresh_from_db()
    return job


def reload(job: Job) -> Job:
    job.refresh_from_db()
    return job


@pytest.mark.django_db
def test_a_job_after_one_still_running_waits_pending_out_of_the_queue(submit):
    a = submit("bob")
    b = submit("bob", after=[{"job": a.pk}])
    assert (b.phase, b.reason, b.dependency_wait) == (P.PENDING, "Dependency", True)
    assert b.message == f"Waits for job {a.pk} to succeed"
    assert list(b.events.values_list("reason", "message")) == [
        ("Submitted", "Submitted by bob to phusers"), ("Dependency", f"Waits for job {a.pk} to succeed")]
    dep = JobDependency.objects.get(job=b)
    assert (dep.on_job_id, dep.when, dep.satisfied_at) == (a.pk, OK, None)


@pytest.mark.django_db
def test_a_job_waiting_on_a_dependency_has_no_queue_position_and_takes_none(submit):
    a = submit("bob")
    waiting = submit("bob", after=[{"job": a.pk}])
    queued = submit("bob")
    services.job_transition(job=a, phase=P.PENDING, reason="Queued")
    services.job_transition(job=queued, phase=P.PENDING, reason="Queued")
    assert selectors.queue_positions([a.pk, waiting.pk, queued.pk]) == {a.pk: 1, queued.pk: 2}


@pytest.mark.django_db
def test_a_job_after_one_already_met_does_not_wait(submit):
    a = end(submit("bob"), P.FAILED)
    b = submit("bob", after=[{"job": a.pk, "when": "notok"}])
    assert (b.phase, b.dependency_wait) == (P.SUBMITTED, False)
    assert JobDependency.objects.get(job=b).satisfied_at is not None


@pytest.mark.parametrize("when, ends, released", [
    ("ok", P.SUCCEEDED, True), ("ok", P.FAILED, False), ("ok", P.CANCELLED, False),
    ("notok", P.FAILED, True), ("notok", P.CANCELLED, True), ("notok", P.SUCCEEDED, False),
    ("any", P.SUCCEEDED, True), ("any", P.FAILED, True), ("any", P.CANCELLED, True),
])
@pytest.mark.django_db
def test_the_end_of_a_job_settles_what_waits_for_it(submit, when, ends, released):
    a = submit("bob")
    b = submit("bob", after=[{"job": a.pk, "when": when}])
    end(a, ends)
    b = reload(b)
    dep = JobDependency.objects.get(job=b)
    if released:
        assert (b.phase, b.reason, b.dependency_wait) == (P.PENDING, "Queued", False)
        assert b.message.startswith(f"Dependencies met: job {a.pk}") and dep.satisfied_at is not None
    else:
        assert (b.phase, b.status, b.reason) == (P.CANCELLED, "Cancelled", "DependencyNeverSatisfied")
        assert not b.dependency_wait and dep.satisfied_at is None
        event = b.events.last()
        assert (event.type, event.reason) == ("Warning", "DependencyNeverSatisfied")
        assert event.message.startswith(f"Waited for job {a.pk} to ")


@pytest.mark.django_db
def test_a_job_waits_until_its_last_dependency_is_met_and_says_what_is_left(submit):
    a, c = submit("bob"), submit("bob")
    b = submit("bob", after=[{"job": a.pk}, {"job": c.pk, "when": "any"}])
    assert b.message == f"Waits for job {a.pk} to succeed and job {c.pk} to end"
    end(a, P.SUCCEEDED)
    b = reload(b)
    assert (b.phase, b.reason, b.dependency_wait, b.message) == (
        P.PENDING, "Dependency", True, f"Waits for job {c.pk} to end")
    end(c, P.CANCELLED)
    assert (reload(b).reason, reload(b).dependency_wait) == ("Queued", False)


@pytest.mark.django_db
def test_never_cascades_down_a_chain(submit):
    a = submit("bob")
    b = submit("bob", after=[{"job": a.pk}])
    c = submit("bob", after=[{"job": b.pk}])
    d = submit("bob", after=[{"job": b.pk, "when": "notok"}])
    end(a, P.FAILED)
    assert reload(b).reason == reload(c).reason == "DependencyNeverSatisfied"
    assert (reload(d).reason, reload(d).dependency_wait) == ("Queued", False)  # b ended without succeeding


def make_array(world, n: int, user: str = "bob", group: str = "phusers") -> tuple[JobArray, list[Job]]:
    """An array and its members, made with the ORM as an array submission would make them."""
    u, g = world.users[user], world.groups[group]
    array = JobArray.objects.create(name="sweep", group=g, user=u, indices=f"0-{n - 1}", size=n)
    it = world.types["cpu-tiny"]
    members = [Job.objects.create(name=f"sweep[{i}]", group=g, user=u, image=world.image, image_url=world.image.url,
                                  instance_type=it, gpu=it.gpu, cpu_millicores=it.cpu_millicores,
                                  memory_bytes=it.memory_bytes, command="true", array=array, array_index=i,
                                  phase=P.SUBMITTED, status="Submitted", queued_at=timezone.now())
               for i in range(n)]
    return array, members


@pytest.mark.django_db
def test_an_array_dependency_is_decided_when_every_member_has_ended(world, submit):
    array, members = make_array(world, 3)
    ok = submit("bob", after=[{"array": array.pk}])
    notok = submit("bob", after=[{"array": array.pk, "when": "notok"}])
    assert ok.message == f"Waits for every job of array {array.pk} to succeed"
    end(members[0], P.SUCCEEDED)
    end(members[1], P.FAILED)  # ok can no longer be met, but is decided only when all have ended
    assert reload(ok).phase == P.PENDING and reload(ok).dependency_wait
    end(members[2], P.SUCCEEDED)
    assert reload(ok).reason == "DependencyNeverSatisfied"
    assert reload(ok).events.last().message == (
        f"Waited for every job of array {array.pk} to succeed, which can never happen: array {array.pk} ended with "
        "a job that did not succeed")
    assert (reload(notok).reason, reload(notok).dependency_wait) == ("Queued", False)


@pytest.mark.django_db
def test_the_end_of_a_job_nothing_waits_for_costs_one_query(submit):
    a = submit("bob")
    with CaptureQueriesContext(connection) as queries:
        dependents_on_end(job=a, now=a.created_at)
    assert len(queries) == 1


@pytest.mark.django_db
def test_a_job_cancelled_while_waiting_is_queued_by_a_restart_once_its_dependency_is_met(submit, world):
    a = submit("bob")
    b = submit("bob", after=[{"job": a.pk}])
    services.job_cancel(job=b, by=world.users["bob"])
    end(a, P.SUCCEEDED)
    assert not reload(b).dependency_wait  # a restart puts it in the queue
    services.job_restart(job=reload(b), by=world.users["bob"])
    assert (reload(b).phase, reload(b).dependency_wait) == (P.PENDING, False)


# --- refused at submit: the after field names why, nothing is written -----------------------------------------

REFUSED = [
    ("unknown job", lambda w, a: [{"job": 999999}], "There is no job 999999 that you can see."),
    ("a job of a group the user is not in", lambda w, a: [{"job": a["eve"].pk}], "that you can see"),
    ("unknown array", lambda w, a: [{"array": 424242}], "There is no array 424242 that you can see."),
    ("a bad when", lambda w, a: [{"job": a["bob"].pk, "when": "soon"}], "when must be ok, notok or any"),
    ("a duplicate", lambda w, a: [{"job": a["bob"].pk}, {"job": a["bob"].pk, "when": "any"}], "listed twice"),
    ("afterok on a failed job", lambda w, a: [{"job": a["failed"].pk}],
     "has already failed; it can never succeed"),
    ("afternotok on a succeeded job", lambda w, a: [{"job": a["succeeded"].pk, "when": "notok"}],
     "has already succeeded; it can never end without succeeding"),
]


@pytest.mark.parametrize("after, message", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
@pytest.mark.django_db
def test_a_submit_with_a_bad_after_is_refused_on_the_after_field(world, submit, after, message):
    jobs = {"bob": submit("bob"), "eve": submit("eve", group="other"), "failed": end(submit("bob"), P.FAILED),
            "succeeded": end(submit("bob"), P.SUCCEEDED)}
    count = Job.objects.count()
    with pytest.raises(ValidationError) as exc:
        services.job_spec_validate(user=world.users["bob"], data={
            "group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny", "command": "true",
            "after": after(world, jobs)})
    assert list(exc.value.message_dict) == ["after"]
    assert message in exc.value.message_dict["after"][0]
    assert Job.objects.count() == count and not JobDependency.objects.exists()


@pytest.mark.django_db
def test_a_cycle_among_what_the_targets_wait_for_is_refused(world, submit):
    x, y = submit("bob"), submit("bob")
    # A cycle no submit can make, written directly: x waits for y, y for x.
    JobDependency.objects.create(job=x, on_job=y)
    JobDependency.objects.create(job=y, on_job=x)
    with pytest.raises(ValidationError) as exc:
        services.job_spec_validate(user=world.users["bob"], data={
            "group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny", "command": "true",
            "after": [{"job": x.pk}]})
    assert exc.value.message_dict["after"] == [
        f"These dependencies would make a cycle: job {x.pk} waits for job {y.pk} waits for job {x.pk}."]


@pytest.mark.django_db
def test_members_of_an_array_cannot_wait_for_their_own_array(world):
    array, members = make_array(world, 2)
    with pytest.raises(ValidationError) as exc:
        dependencies_record(jobs=members, after=[{"array": array.pk}], user=world.users["bob"])
    assert "cycle" in exc.value.message_dict["after"][0]


@pytest.mark.django_db
def test_array_members_recorded_together_wait_for_one_job(world, submit):
    a = submit("bob")
    _, members = make_array(world, 3)
    rows = dependencies_record(jobs=members, after=[After("job", a.pk, ANY)], user=world.users["bob"])
    assert len(rows) == 3
    assert {(m.phase, m.reason, m.dependency_wait) for m in map(reload, members)} == {
        (P.PENDING, "Dependency", True)}
    end(a, P.FAILED)
    assert {(m.reason, m.dependency_wait) for m in map(reload, members)} == {("Queued", False)}


# --- the job page ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_job_page_shows_what_a_job_waits_for_and_what_waits_for_it(world, submit, login):
    array, _ = make_array(world, 2)
    a = submit("bob", name="train")
    b = submit("bob", name="evaluate", after=[{"job": a.pk}, {"array": array.pk, "when": "any"}])
    client = login("pan")

    page_b = client.get(f"/jobs/{b.pk}/").content.decode()
    assert "Waits for" in page_b and "Waited on by" not in page_b
    assert f'<a href="/jobs/{a.pk}/">job #{a.pk}</a>' in page_b
    assert f'<a href="/arrays/{array.pk}/">array #{array.pk}</a>' in page_b
    assert "succeeded <span class=\"muted mono\">(afterok)</span>" in page_b
    assert "<strong>not yet</strong>" in page_b

    page_a = client.get(f"/jobs/{a.pk}/").content.decode()
    assert "Waited on by" in page_a and "Waits for" not in page_a
    assert f'<tr data-dependent="{b.pk}">' in page_a and "evaluate" in page_a

    end(a, P.SUCCEEDED)
    page_b = client.get(f"/jobs/{b.pk}/").content.decode()
    assert f'<tr data-dependency="job-{a.pk}">' in page_b
    row = page_b[page_b.index(f'data-dependency="job-{a.pk}"'):]
    assert "<td>met</td>" in row[:row.index("</tr>")]


@pytest.mark.django_db
def test_the_job_page_of_a_job_without_dependencies_has_no_such_section(submit, login):
    a = submit("bob")
    page = login("bob").get(f"/jobs/{a.pk}/").content.decode()
    assert "dependencies-card" not in page


@pytest.mark.django_db
def test_without_a_viewer_no_job_that_waits_is_named(submit):
    from jobs.dependency_selectors import job_dependencies

    a = submit("bob")
    b = submit("bob", after=[{"job": a.pk}])
    assert [w.id for w in job_dependencies(a, a.user).waited_by] == [b.pk]
    assert job_dependencies(a, None).waited_by == []
    assert [d.id for d in job_dependencies(b, None).after] == [a.pk]
