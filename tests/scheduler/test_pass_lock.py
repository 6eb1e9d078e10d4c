"""A pass holds the scheduling lock (every group's row) while it reads, decides and writes. A submit meanwhile must
not wait for it: the new job's row refers to its group, and PostgreSQL checks that reference with a key-share lock on
the group's row, which the pass's FOR UPDATE held off until the pass committed (the submit's answer waited for a
whole pass). The pass locks the rows FOR NO KEY UPDATE: passes still exclude each other, submits go through, and a
job submitted meanwhile is decided by the next pass."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from jobs.choices import Phase
from jobs.models import Job
from scheduler import carry
from scheduler.passes import schedule_pass
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_on_a_row() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype IN ('transactionid', 'tuple')")
        return cursor.fetchone()[0] > 0


def test_a_submit_goes_through_while_a_pass_holds_the_scheduling_lock_and_another_pass_waits(submit, monkeypatch):
    holding, release = threading.Event(), threading.Event()
    recall = carry.memory.recall

    def held(*args):  # called under the lock: the first pass holds it until the test lets it go
        if not holding.is_set():
            holding.set()
            release.wait(120)
        return recall(*args)

    monkeypatch.setattr(carry.memory, "recall", held)
    errors: list[Exception] = []

    def a_pass() -> None:
        try:
            schedule_pass()
        except Exception as exc:  # noqa: BLE001  (reported by the assertion below)
            errors.append(exc)
        finally:
            connections.close_all()

    first, second = threading.Thread(target=a_pass), threading.Thread(target=a_pass)
    first.start()
    try:
        assert holding.wait(120), "the pass did not take the lock"
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '20s'")  # FOR UPDATE: the submit waits for the pass, then fails
        try:
            job = submit("bob")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        second.start()  # another pass waits for the lock
        wait_for(waiting_on_a_row, timeout=60, message="the second pass to wait for the first one's lock")
    finally:
        release.set()
        first.join(120)
        if second.is_alive() or second.ident:
            second.join(120)
    assert errors == []
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING  # the second pass, after the first, admitted it
    assert Job.objects.count() == 1
