"""Estimated start times written by the scheduling pass (PostgreSQL, through schedule_pass) and the history of
similar jobs they are refined by."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import durations, selectors, services
from jobs.choices import Phase
from jobs.models import Job
from scheduler import pass_estimates
from scheduler.estimate import step_time
from scheduler.passes import schedule_pass

pytestmark = [pytest.mark.fast, pytest.mark.django_db, pytest.mark.usefixtures("estimates_each_pass")]


@pytest.fixture
def t0():
    return timezone.now().replace(microsecond=0)


def ran(submit, t, minutes, **spec):
    """A job of ``spec`` that was admitted at ``t`` and succeeded ``minutes`` later."""
    job = submit(**spec)
    schedule_pass(now=t)
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING
    services.job_transition(job=job, phase=Phase.SUCCEEDED, reason="Completed", exit_code=0,
                            now=t + timedelta(minutes=minutes))
    return job


def test_a_waiting_job_gets_the_start_its_queue_head_s_deadline_gives(submit, t0):
    holder = submit("bob", "gpu-4", name="holder", active_deadline_seconds=3600)
    schedule_pass(now=t0)
    waiter = submit("pan", "gpu-1", name="waiter")
    behind = submit("lin", "gpu-4", name="behind")
    schedule_pass(now=t0)
    waiter.refresh_from_db()
    behind.refresh_from_db()
    holder.refresh_from_db()
    assert holder.phase == Phase.PREPARING and holder.estimated_start is None
    assert (waiter.reason, selectors.queue_positions([waiter.pk])) == ("GroupQuota", {waiter.pk: 1})  # derived
    assert waiter.estimated_start == step_time(t0, t0 + timedelta(hours=1))
    assert waiter.estimate_basis == "deadlines"
    # lin's 4 GPUs wait for the waiter's default deadline (a day) on top of that.
    assert behind.estimated_start == step_time(t0, waiter.estimated_start + timedelta(days=1))


def test_the_estimate_is_cleared_when_the_job_is_admitted_or_cancelled(submit, t0, world):
    holder = submit("bob", "gpu-4", active_deadline_seconds=3600)
    schedule_pass(now=t0)
    waiter = submit("pan", "gpu-2")
    other = submit("lin", "gpu-2")
    schedule_pass(now=t0)
    assert Job.objects.filter(pk__in=[waiter.pk, other.pk], estimated_start__isnull=False).count() == 2

    services.job_cancel(job=Job.objects.get(pk=other.pk), by=world.users["lin"])
    other.refresh_from_db()
    assert (other.phase, other.estimated_start, other.estimate_basis) == (Phase.CANCELLED, None, "")

    holder.refresh_from_db()
    services.job_transition(job=holder, phase=Phase.SUCCEEDED, reason="Completed", exit_code=0,
                            now=t0 + timedelta(minutes=5))
    schedule_pass(now=t0 + timedelta(minutes=5))
    waiter.refresh_from_db()
    assert waiter.phase == Phase.PREPARING
    assert (waiter.estimated_start, waiter.estimate_basis) == (None, "")


def test_history_of_similar_jobs_refines_the_estimate(submit, t0):
    for day in (3, 2, 1):  # bob's "train" ran 20, 10 and 30 minutes: median 20
        ran(submit, t0 - timedelta(days=day), {3: 20, 2: 10, 1: 30}[day], username="bob", instance_type="gpu-4",
            name="train")
    submit("bob", "gpu-4", name="train")
    schedule_pass(now=t0)
    waiter = submit("pan", "gpu-1", name="other")
    schedule_pass(now=t0)
    waiter.refresh_from_db()
    assert waiter.estimated_start == step_time(t0, t0 + timedelta(minutes=20))
    assert waiter.estimate_basis == "history"


def test_history_lookup_falls_back_from_name_to_instance_type_to_group(submit, t0, world):
    for i, minutes in enumerate([10, 20, 30]):
        ran(submit, t0 - timedelta(hours=i + 1), minutes, username="bob", instance_type="gpu-1", name=f"sweep-{i}")
    for minutes in (40, 50, 60):
        ran(submit, t0 - timedelta(hours=5), minutes, username="pan", instance_type="gpu-1", name="eval")
    ran(submit, t0 - timedelta(hours=6), 5, username="pan", instance_type="gpu-1", name="preempted-run")
    from jobs.models import Attempt

    Attempt.objects.filter(job__name="preempted-run").update(outcome="Preempted")  # not how long it runs

    history = durations.job_duration_history(since=t0 - timedelta(days=30))
    ph, bob, pan, lin = world.groups["phusers"].pk, world.users["bob"].pk, world.users["pan"].pk, world.users["lin"].pk
    gpu1 = world.types["gpu-1"].pk

    def expected(user, name, deadline=86400):
        return history.expected(user_id=user, group_id=ph, name=name, instance_type_id=gpu1, deadline=deadline)

    assert expected(pan, "eval") == (3000.0, "history")  # pan's "eval": 40, 50, 60 minutes
    assert expected(bob, "new-name") == (1200.0, "history")  # bob's gpu-1 jobs: 10, 20, 30 minutes
    assert expected(lin, "anything") == (2100.0, "history")  # phusers' gpu-1 jobs: the median of all six
    assert expected(pan, "eval", deadline=600) == (600.0, "history")  # never longer than the deadline
    assert history.expected(user_id=bob, group_id=ph, name="x", instance_type_id=world.types["gpu-2"].pk,
                            deadline=7200) == (2100.0, "history")  # the group's jobs, whatever their type
    assert history.expected(user_id=bob, group_id=world.groups["other"].pk, name="x",
                            instance_type_id=world.types["gpu-2"].pk, deadline=7200) == (7200.0, "deadlines")


def test_without_history_of_its_own_a_job_expects_what_its_like_ran_elsewhere(submit, t0, world):
    """A new user's first job: nothing of theirs or their group's has run, but the same instance type has, once, in
    another group (issue 22.5: never a date days out for a job whose like runs for seconds)."""
    ran(submit, t0 - timedelta(hours=1), 1, username="lin", group="research", instance_type="gpu-1", name="probe")
    history = durations.job_duration_history(since=t0 - timedelta(days=30))
    ph, rs, bob = world.groups["phusers"].pk, world.groups["research"].pk, world.users["bob"].pk
    gpu1, gpu2 = world.types["gpu-1"].pk, world.types["gpu-2"].pk

    def expected(group, type_id, deadline=86400):
        return history.expected(user_id=bob, group_id=group, name="first", instance_type_id=type_id,
                                deadline=deadline)

    assert expected(ph, gpu1) == (60.0, "history")  # the instance type, anywhere on the site: one run of 1 minute
    assert expected(rs, gpu2) == (60.0, "history")  # the group, whatever the instance type
    assert expected(ph, gpu2) == (86400.0, "deadlines")  # nothing like it ran: its deadline, the latest it can end
    # Enough runs of a closer kind win over a single run of a wider one.
    for minutes in (10, 10, 10):
        ran(submit, t0 - timedelta(minutes=30), minutes, username="pan", instance_type="gpu-1", name="x")
    history = durations.job_duration_history(since=t0 - timedelta(days=30))
    assert expected(ph, gpu1) == (600.0, "history")


def test_history_counts_only_the_newest_runs_and_ignores_old_ones(submit, t0, world):
    for start, minutes in [(t0 - timedelta(days=40), 5), (t0 - timedelta(hours=3), 90), (t0 - timedelta(hours=2), 10),
                           (t0 - timedelta(hours=1), 20)]:
        ran(submit, start, minutes, username="bob", instance_type="gpu-1", name="train")
    key = (world.users["bob"].pk, world.groups["phusers"].pk, "train")
    since = t0 - timedelta(days=30)  # the 5-minute run is older
    assert durations.job_duration_history(since=since).by_name[key] == 20 * 60  # 90, 10, 20
    assert durations.job_duration_history(since=since, samples=2, min_samples=2).by_name[key] == 15 * 60  # 10, 20
    assert key not in durations.job_duration_history(since=since, min_samples=4).by_name


def test_an_unchanged_estimate_is_not_written_again(submit, t0, monkeypatch):
    submit("bob", "gpu-4", active_deadline_seconds=7200)
    schedule_pass(now=t0)
    waiter = submit("pan", "gpu-1")
    writes = []
    real = services.job_estimate_update
    monkeypatch.setattr(services, "job_estimate_update", lambda updates: (writes.append(dict(updates)),
                                                                          real(updates)))
    schedule_pass(now=t0)
    schedule_pass(now=t0 + timedelta(seconds=20))
    assert [set(w) for w in writes] == [{waiter.pk}, set()]


def test_beyond_the_horizon_there_is_no_estimate(submit, t0):
    submit("bob", "gpu-4", active_deadline_seconds=20 * 86400)
    schedule_pass(now=t0)
    first = submit("pan", "gpu-4", active_deadline_seconds=20 * 86400)
    second = submit("lin", "gpu-1")
    schedule_pass(now=t0)
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.estimated_start == step_time(t0, t0 + timedelta(days=20))
    assert second.phase == Phase.PENDING and selectors.queue_positions([second.pk]) == {second.pk: 2}  # 40 days on
    assert (second.estimated_start, second.estimate_basis) == (None, "")


# --- the pages ----------------------------------------------------------------------------------------------


def test_the_estimates_of_more_jobs_than_a_statement_takes_are_all_written(submit):
    """A pass over 70,000 waiting jobs changed every estimate: their rows were read as one statement, which
    PostgreSQL refused (more than 65,535 parameters), and none was written."""
    job = submit("bob")
    services.job_transition(job=job, phase=Phase.PENDING, reason="GroupQuota", message="waiting")
    start = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    updates = {pk: (start, "history") for pk in range(10**9, 10**9 + 70_000)}  # ids of no job: only the size
    services.job_estimate_update({**updates, job.pk: (start, "history")})
    assert Job.objects.values_list("estimated_start", "estimate_basis").get(pk=job.pk) == (start, "history")


def test_the_queue_positions_of_more_jobs_than_a_statement_takes_are_read_in_parts(submit):
    """The live rows of a 50,000-job batch asked the positions of all of them in one statement, which named each
    id twice: refused by PostgreSQL (more than 65,535 parameters)."""
    first, second = submit("bob"), submit("bob")
    for job in (first, second):
        services.job_transition(job=job, phase=Phase.PENDING, reason="GroupQuota", message="waiting")
    gone = range(10**9, 10**9 + 70_000)  # ids of no job: only the statement's size matters
    assert selectors.queue_positions([*gone, second.pk]) == {second.pk: 2}


def pending_with(job, *, start=None, basis=""):
    """``job`` pending (its position is derived: the jobs made pending before it are ahead), showing the estimate
    ``start`` (None: not within the horizon)."""
    services.job_transition(job=job, phase=Phase.PENDING, reason="GroupQuota",
                            message="waiting for group GPU quota of phusers: 4 GPU used of 4 GPU, asks 2 GPU")
    services.job_estimate_update({job.pk: (start, basis)})
    job.refresh_from_db()
    return job


def test_list_detail_and_queue_pages_show_the_estimated_start(login, submit):
    today = timezone.localtime().replace(hour=23, minute=59, second=0, microsecond=0)
    later = (timezone.localtime() + timedelta(days=3)).replace(second=0, microsecond=0)
    soon = pending_with(submit("bob", "gpu-2", name="soon"), start=today, basis="deadlines")
    pending_with(submit("pan", "gpu-2", name="far"), start=later, basis="history")
    never = pending_with(submit("lin", "gpu-2", name="never"))
    client = login("bob")

    html = client.get("/").content.decode()
    assert (f'#1 in phusers · <span class="estimate" title="Estimated as if every job ahead ran to its deadline: '
            f'likely earlier" data-start="{today.isoformat()}">est. start 23:59 at the latest (by deadlines)</span>'
            in html)
    assert f'data-start="{later.isoformat()}">est. start {later:%Y-%m-%d %H:%M} (by history)' in html  # not today
    assert "#3 in phusers · " in html and "est. start not within 30 days" in html

    detail = client.get(f"/jobs/{soon.pk}/").content.decode()
    assert re.search(r"<dt>Estimated start</dt><dd class=\"estimated-start\"><span class=\"estimate\"[^>]*>"
                     r"est. start 23:59 at the latest \(by deadlines\)</span>", detail)
    assert "est. start not within 30 days" in client.get(f"/jobs/{never.pk}/").content.decode()

    queue = client.get("/groups/phusers/queue/").content.decode()
    assert "<th>Est. start</th>" in queue
    assert f"est. start {later:%Y-%m-%d %H:%M} (by history)" in queue


def test_no_estimate_is_shown_once_the_job_runs(login, submit):
    job = pending_with(submit("bob", "gpu-2", name="gone"), start=timezone.now() + timedelta(hours=1),
                       basis="deadlines")
    services.job_admit(job=Job.objects.get(pk=job.pk), backend="local", placement=[{"node": "local"}])
    html = login("bob").get(f"/jobs/{job.pk}/").content.decode()
    assert "est. start" not in html and "Estimated start" not in html


def test_a_failing_estimate_never_holds_back_admission(submit, t0, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("estimator bug")

    monkeypatch.setattr(pass_estimates, "estimate", broken)
    job = submit("bob", "gpu-1")
    waiting = submit("pan", "gpu-4")
    result = schedule_pass(now=t0)
    assert result.admitted == [job.pk] and result.waiting == 1
    waiting.refresh_from_db()
    assert (waiting.phase, waiting.estimated_start) == (Phase.PENDING, None)
    assert "could not estimate" in caplog.text


@pytest.mark.parametrize("phase, position, start, basis, text", [
    (Phase.PENDING, 3, "today 14:20", "history", "est. start 14:20 (by history)"),
    (Phase.PENDING, 3, "2026-01-02 09:05", "deadlines", "est. start 2026-01-02 09:05 at the latest (by deadlines)"),
    (Phase.PENDING, 3, None, "", "est. start not within 30 days"),
    (Phase.PENDING, None, None, "", ""),
    (Phase.RUNNING, None, "today 14:20", "history", ""),
])
def test_estimate_text(phase, position, start, basis, text):
    from datetime import datetime

    from jobs.estimate_text import estimate_text

    if start == "today 14:20":
        start = timezone.localtime().replace(hour=14, minute=20)
    elif start:
        start = timezone.make_aware(datetime.fromisoformat(start))
    assert estimate_text(phase, position, start, basis) == text


def test_many_estimates_are_written_in_one_statement_per_batch_on_sqlite_too(tmp_path):
    """The embedded default's SQLite takes the same ``UPDATE … FROM (VALUES …)`` as PostgreSQL (its VALUES columns
    named column1, …), batched under its limit of parameters; a row not named keeps its values."""
    from django.db.backends.sqlite3.base import DatabaseWrapper

    from jobs.services.waiting import update_from_values

    db = DatabaseWrapper({**connection.settings_dict, "ENGINE": "django.db.backends.sqlite3",
                          "NAME": str(tmp_path / "estimates.sqlite3"), "OPTIONS": {}}, alias="sqlite-test")
    table = Job._meta.db_table
    with db.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, estimated_start datetime NULL, "
                       "estimate_basis varchar(16) NOT NULL)")
        cursor.executemany(f"INSERT INTO {table} VALUES (%s, NULL, '')", [(n,) for n in range(1, 1002)])
    start = timezone.now().replace(microsecond=0)
    rows = {n: (start + timedelta(minutes=n), "history") for n in range(1, 1001)}
    with CaptureQueriesContext(db) as queries:
        update_from_values(rows, ["estimated_start", "estimate_basis"], db)
    assert len(queries) == 4  # 333 rows a statement: 999 parameters at most
    with db.cursor() as cursor:
        cursor.execute(f"SELECT id, estimated_start, estimate_basis FROM {table} WHERE id IN (1, 1000, 1001)")
        rows = {n: (db.ops.convert_datetimefield_value(when, None, db) if when else None, basis)
                for n, when, basis in cursor.fetchall()}
    db.close()
    assert rows == {1: (start + timedelta(minutes=1), "history"), 1000: (start + timedelta(minutes=1000), "history"),
                    1001: (None, "")}
