"""Admission by queue heads, through real scheduling passes: the jobs behind a group's head are neither read one by
one nor given an event; they show the head, and their positions are derived where they are read."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs import selectors, services
from jobs.choices import Phase
from jobs.models import Job, JobEvent
from scheduler.passes import schedule_pass

pytestmark = [pytest.mark.fast, pytest.mark.django_db]


def queue(submit, n):
    """bob holds phusers' 4 GPUs; pan's job waits for them (the head), then ``n`` more of lin's and pan's."""
    submit("bob", "gpu-4", name="holder")
    head = submit("pan", "gpu-2", name="head")
    behind = [submit("lin" if i % 2 else "pan", "gpu-1", name=f"behind-{i}") for i in range(n)]
    schedule_pass()
    return head, behind


def test_jobs_behind_the_head_name_it_and_get_one_event_only(submit):
    head, behind = queue(submit, 6)
    rows = {j.pk: j for j in Job.objects.filter(pk__in=[b.pk for b in behind])}
    assert {(j.phase, j.reason, j.message) for j in rows.values()} == {
        (Phase.PENDING, "BlockedByQueueHead", f"behind job #{head.pk} (head), which waits for group quota")}
    events = JobEvent.objects.filter(job__in=behind).count()
    assert events == 2 * len(behind)  # Submitted, then into the queue (a phase change)

    schedule_pass()
    schedule_pass()
    assert JobEvent.objects.filter(job__in=behind).count() == events  # waiting on: nothing new to say


def test_a_new_head_is_named_by_every_job_behind_it_without_events(submit, world):
    head, behind = queue(submit, 5)
    events = JobEvent.objects.filter(job__in=behind[1:]).count()
    services.job_cancel(job=head, by=world.users["pan"])
    schedule_pass()
    first = Job.objects.get(pk=behind[0].pk)
    assert first.phase == Phase.PENDING and first.reason == "GroupQuota"  # the new head: its own reason changed
    assert set(Job.objects.filter(pk__in=[b.pk for b in behind[1:]]).values_list("reason", "message")) == {
        ("BlockedByQueueHead", f"behind job #{first.pk} (behind-0), which waits for group quota")}
    assert JobEvent.objects.filter(job__in=behind[1:]).count() == events
    assert selectors.queue_positions([b.pk for b in behind]) == {b.pk: i + 1 for i, b in enumerate(behind)}


def test_positions_are_derived_in_queue_order_for_pending_jobs_only(submit):
    head, behind = queue(submit, 3)
    urgent = submit("lin", "gpu-1", name="urgent", priority=100)
    schedule_pass()
    positions = selectors.queue_positions([head.pk, urgent.pk, *(b.pk for b in behind)])
    assert positions[urgent.pk] == 1  # higher priority goes first: it is the head now
    assert [positions[b.pk] for b in behind] == [3, 4, 5] and positions[head.pk] == 2
    admitted = Job.objects.filter(phase=Phase.PREPARING).values_list("pk", flat=True)
    assert selectors.queue_positions(admitted) == {}
    jobs = selectors.with_queue_positions(Job.objects.filter(pk__in=[urgent.pk, *admitted]))
    assert {j.pk: j.queue_position for j in jobs} == {urgent.pk: 1, **dict.fromkeys(admitted)}


def test_a_steady_pass_reads_as_much_for_a_long_queue_as_for_a_short_one(submit):
    def steady_queries():
        schedule_pass()
        with CaptureQueriesContext(connection) as queries:
            schedule_pass()
        return len(queries)

    queue(submit, 2)
    short = steady_queries()
    for i in range(30):
        submit("lin", "gpu-1", name=f"more-{i}")
    schedule_pass()
    assert steady_queries() == short
    assert Job.objects.filter(phase=Phase.PENDING, reason="BlockedByQueueHead").count() == 32


def test_more_of_a_queue_is_read_while_its_first_jobs_are_all_admitted(submit, world):
    from jobs.models import GroupQuota

    GroupQuota.objects.filter(group=world.groups["phusers"], resource="gpu").update(quota=64, user_quota=64)
    jobs = [submit("pan", "cpu-tiny", name=f"small-{i}") for i in range(12)]  # more than a pass reads at first
    schedule_pass()
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("phase", flat=True)) == {Phase.PREPARING}


def test_jobs_waiting_for_their_users_quota_ahead_of_the_head_cost_no_second_read(submit, world):
    def steady_queries():  # the reads of the queue in a steady pass
        schedule_pass()
        with CaptureQueriesContext(connection) as queries:
            schedule_pass()
        return len([q for q in queries if "dependency_wait" in q["sql"]])

    from jobs.models import GroupQuota

    GroupQuota.objects.filter(group=world.groups["phusers"], resource="gpu").update(quota=8)
    submit("bob", "gpu-4", name="bob-runs")  # bob at his user quota
    submit("pan", "gpu-4", name="pan-runs")  # the group at its quota
    head, *behind = [submit("lin", "gpu-1", name=f"lin-{i}") for i in range(4)]
    plain = steady_queries()
    skipped = [submit("bob", "gpu-1", name=f"urgent-{i}", priority=100) for i in range(3)]  # first in queue order
    assert steady_queries() == plain
    assert set(Job.objects.filter(pk__in=[j.pk for j in skipped]).values_list("reason", flat=True)) == {"UserQuota"}
    assert Job.objects.get(pk=head.pk).reason == "GroupQuota"
    assert set(Job.objects.filter(pk__in=[j.pk for j in behind]).values_list("reason", flat=True)) == {
        "BlockedByQueueHead"}


def holding_reads(queries) -> list[str]:
    """The full reads of jobs holding resources among ``queries`` (the pass reads them only when new or changed)."""
    return [q["sql"] for q in queries if '"over_quota"' in q["sql"] and "current_attempt_id" in q["sql"]]


def test_a_steady_pass_parses_no_running_job_again(submit, world):
    from jobs.models import GroupQuota

    GroupQuota.objects.filter(group=world.groups["phusers"], resource="gpu").update(quota=64, user_quota=64)
    jobs = [submit("pan", "cpu-tiny", name=f"small-{i}") for i in range(6)]
    schedule_pass()
    schedule_pass()  # the admitted jobs read once
    with CaptureQueriesContext(connection) as queries:
        schedule_pass()
    assert connection.vendor != "postgresql" or holding_reads(queries) == []
    services.job_transition(job=Job.objects.get(pk=jobs[2].pk), phase=Phase.RUNNING)
    with CaptureQueriesContext(connection) as queries:
        schedule_pass()
    reads = holding_reads(queries)
    assert connection.vendor != "postgresql" or (len(reads) == 1 and f"({jobs[2].pk})" in reads[0])


def test_a_running_job_changed_in_place_is_seen_by_the_next_pass(submit):
    """Even when the change is made in the transaction that ran the last pass (one row version id for both)."""
    holder = submit("bob", "gpu-4", name="holder")
    schedule_pass()
    assert Job.objects.get(pk=holder.pk).phase == Phase.PREPARING
    Job.objects.filter(pk=holder.pk).update(message="running")  # written by this transaction
    schedule_pass()  # which the cache of running jobs reads
    Job.objects.filter(pk=holder.pk).update(preemptible=True)  # by the same transaction: now a candidate victim
    urgent = submit("pan", "gpu-4", name="urgent", priority=100)
    schedule_pass()
    assert Job.objects.get(pk=holder.pk).phase == Phase.TERMINATING
    assert Job.objects.get(pk=urgent.pk).reason == "Preempting"


def test_positions_follow_the_queue_order_whether_read_alone_or_together(submit, world):
    """A job's position read alone (a submit's answer, a changed row) or with others (a list page) follows the
    queue order: preempting jobs first, then priority, then submission time, then id (ties in time included); jobs
    waiting on a dependency and other groups' jobs are not counted."""
    jobs = [submit(user, "gpu-1", group=group, name=f"q{n}", priority=priority)
            for n, (user, group, priority) in enumerate([
                ("bob", "phusers", 0), ("pan", "phusers", 100), ("lin", "research", 0), ("lin", "phusers", 0),
                ("bob", "phusers", 100), ("pan", "phusers", -100), ("lin", "research", 100), ("bob", "phusers", 0)])]
    tie = jobs[0].queued_at
    Job.objects.filter(pk__in=[jobs[3].pk, jobs[7].pk]).update(queued_at=tie)  # same time as q0: id decides
    Job.objects.filter(pk=jobs[5].pk).update(reason="Preempting")  # first, whatever its priority
    waiting = submit("pan", "gpu-1", name="waits", priority=100)
    Job.objects.filter(pk=waiting.pk).update(dependency_wait=True)
    Job.objects.filter(pk__in=[j.pk for j in jobs] + [waiting.pk]).update(phase=Phase.PENDING)  # all queued
    expected = {jobs[5].pk: 1, jobs[1].pk: 2, jobs[4].pk: 3, jobs[0].pk: 4, jobs[3].pk: 5, jobs[7].pk: 6,
                jobs[6].pk: 1, jobs[2].pk: 2}
    everyone = [*(j.pk for j in jobs), waiting.pk]
    assert selectors.queue_positions(everyone) == expected
    assert {pk: selectors.queue_positions([pk]).get(pk) for pk in everyone} == {**expected, waiting.pk: None}


def test_an_admission_reads_its_job_once(submit, world):
    """A job admitted by a pass is read by its id once, locked, whether it was still SUBMITTED (queued, then
    admitted: two transitions, two events) or already PENDING; the trail is as before."""
    from jobs.models import GroupQuota

    GroupQuota.objects.filter(group=world.groups["phusers"], resource="gpu").update(quota=64, user_quota=64)
    waiting = submit("pan", "cpu-tiny", name="pending")
    Job.objects.filter(pk=waiting.pk).update(phase=Phase.PENDING, status="Pending", reason="Queued")
    fresh = submit("lin", "cpu-tiny", name="submitted")
    with CaptureQueriesContext(connection) as queries:
        schedule_pass()
    for job in (waiting, fresh):
        by_id = [q["sql"] for q in queries
                 if q["sql"].startswith('SELECT "jobs_job"."id"') and f'"jobs_job"."id" = {job.pk}' in q["sql"]]
        assert len(by_id) == 1 and "FOR " in by_id[0], by_id
        assert Job.objects.get(pk=job.pk).phase == Phase.PREPARING
    assert list(JobEvent.objects.filter(job=fresh).order_by("id").values_list("reason", flat=True))[-2:] == [
        "Queued", "Admitted"]
    assert list(JobEvent.objects.filter(job=waiting).order_by("id").values_list("reason", flat=True))[-1:] == [
        "Admitted"]
