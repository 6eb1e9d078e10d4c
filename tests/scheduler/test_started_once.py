"""An attempt's "Started" event is written once, even by two schedulers at once: on PostgreSQL the leader's advisory
lock goes with its connection, so when the database cuts that connection another scheduler takes the lock before the
first one's next round notices; for that moment both sync the same jobs (the chaos run saw an attempt with two)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from jobs import services
from jobs.choices import Phase
from jobs.models import Job, JobEvent
from scheduler.passes import schedule_pass
from scheduler.reconcile import RecordStarted
from scheduler.sync import apply
from tests.waiting import wait_for


def admitted(submit) -> Job:
    job = submit("bob")
    schedule_pass()
    job = Job.objects.select_related("current_attempt").get(pk=job.pk)
    assert job.phase == Phase.PREPARING
    return job


def started(job: Job) -> int:
    return JobEvent.objects.filter(attempt=job.current_attempt, reason="Started").count()


@pytest.mark.fast
@pytest.mark.django_db
def test_a_scheduler_that_read_the_job_before_the_other_wrote_adds_no_second_start(submit):
    job = admitted(submit)
    from scheduler.actuator import get_actuator
    from scheduler.backend_factory import get_backend

    actuator = get_actuator(get_backend())
    for _ in range(2):  # both read "not recorded yet" at the start of their round
        apply(job, [RecordStarted()], actuator=actuator, now=job.updated_at)
    assert started(job) == 1
    assert services.attempt_record_started(job=job, attempt=job.current_attempt) is False


@pytest.mark.django_db(transaction=True)
def test_two_at_once_are_ordered_by_the_jobs_row_and_the_second_writes_nothing(submit):
    job = admitted(submit)
    outcome: list = []

    def other_scheduler() -> None:
        try:
            outcome.append(services.attempt_record_started(job=job, attempt=job.current_attempt))
        finally:
            connections.close_all()

    with transaction.atomic():
        assert services.attempt_record_started(job=job, attempt=job.current_attempt) is True
        thread = threading.Thread(target=other_scheduler)
        thread.start()

        def waits_for_the_row() -> bool:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype IN ('transactionid', "
                               "'tuple')")
                return cursor.fetchone()[0] > 0

        wait_for(waits_for_the_row, timeout=60, message="the other scheduler to wait for the job's row")
    thread.join(60)
    assert outcome == [False] and started(job) == 1
