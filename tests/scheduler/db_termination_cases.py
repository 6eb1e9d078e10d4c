"""The scheduler's rounds when PostgreSQL ends its connections (issue 21.3). Not collected with the suite: these
tests end every connection of their test database, so test_loop.py runs them in a pytest process of their own, on a
database of their own (nothing of the main run's connections can be ended by them)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections
from prometheus_client import REGISTRY

import scheduler.loop as loop_module
from jobs.choices import Phase
from scheduler.leader import dedicated_connection
from scheduler.loop import SchedulerLoop
from tests import waiting

from .test_loop import Switch

pytestmark = pytest.mark.django_db(transaction=True)


def _rounds(name: str) -> dict[str, float]:
    return {r: REGISTRY.get_sample_value(f"jobsite_scheduler_rounds_{name}_total", {"round": r}) or 0.0
            for r in ("admission", "sync")}


def _phase(job) -> str:
    job.refresh_from_db()
    return job.phase


@pytest.fixture
def ends_connections():
    """A test that has PostgreSQL end connections leaves none of them behind for the next test: every connection
    of this process closed, and its pool (whose idle connections may have been ended too) made anew."""
    yield
    connections.close_all()
    for conn in connections.all():
        if getattr(conn, "pool", None) is not None:
            conn.close_pool()


def _end_every_connection() -> int:
    """What PostgreSQL does to its clients on a restart or failover: every other connection to the test database
    ends, all at once. Waits until they are gone; the test's own next query runs on another connection."""
    with dedicated_connection() as admin:
        ended = [pid for pid, ok in admin.execute(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall() if ok]
        waiting.wait_for(lambda: admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [ended]).fetchone()[0] == 0, timeout=20,
            message="the ended connections to be gone")
    connection.close()
    return len(ended)


def test_rounds_after_the_database_ended_every_connection_succeed(submit, settings, caplog, ends_connections):
    """Four times, PostgreSQL ends every connection between jobs: the pool hands out no dead connection and no
    round fails."""
    settings.JOBSITE_SCHEDULER_INTERVAL = 0.1
    failed_before = _rounds("failed")
    loop = SchedulerLoop(elector=Switch(leading=True))
    loop.start()
    try:
        for _ in range(4):
            job = submit("bob", command="true")
            waiting.wait_for(lambda job=job: _phase(job) == Phase.SUCCEEDED, timeout=60, message="the job to succeed")
            assert _end_every_connection() >= 1
        last = submit("bob", command="true")
        waiting.wait_for(lambda: _phase(last) == Phase.SUCCEEDED, timeout=60, message="the last job to succeed")
    finally:
        loop.stop()
        loop.join(10)
    assert _rounds("failed") == failed_before
    assert "round failed" not in caplog.text


def test_a_round_that_lost_its_connection_runs_again_at_once(submit, settings, monkeypatch, caplog,
                                                              ends_connections):
    """PostgreSQL ends the connection of an admission round while it runs: the round runs again at once on a fresh
    connection and admits the job; no round failed."""
    settings.JOBSITE_SCHEDULER_INTERVAL = 60  # rounds when woken only
    real_pass = loop_module.schedule_pass
    armed, killed = threading.Event(), []

    def pass_losing_its_connection(**kw):
        if armed.is_set():
            armed.clear()
            connection.ensure_connection()
            with dedicated_connection() as admin:
                pid = connection.connection.info.backend_pid
                assert admin.execute("SELECT pg_terminate_backend(%s, 30000)", [pid]).fetchone()[0]
            killed.append(pid)
        return real_pass(**kw)

    monkeypatch.setattr(loop_module, "schedule_pass", pass_losing_its_connection)
    retried_before, failed_before = _rounds("retried"), _rounds("failed")
    job = submit("bob", command="true")
    armed.set()
    loop = SchedulerLoop(elector=Switch(leading=True))
    loop.start()
    try:
        waiting.wait_for(lambda: job.refresh_from_db() or job.phase != Phase.SUBMITTED, timeout=60,
                         message="the job admitted")
    finally:
        loop.stop()
        loop.join(10)
    assert killed, "the round's connection was not ended"
    assert job.attempts.count() == 1
    assert _rounds("retried")["admission"] == retried_before["admission"] + 1
    assert _rounds("failed") == failed_before
    assert "admission round lost its database connection" in caplog.text
    assert "round failed" not in caplog.text
