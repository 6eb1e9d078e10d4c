"""The scheduler loop acts only while its elector says it leads; a standby admits nothing and launches nothing."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from jobs.choices import Phase
from scheduler import health
from scheduler.loop import SchedulerLoop
from tests import waiting

pytestmark = pytest.mark.django_db(transaction=True)


class Switch:
    """An elector whose answer the test sets."""

    identity = "test-scheduler"

    def __init__(self, leading: bool):
        self.leading = threading.Event()
        if leading:
            self.leading.set()
        self.rounds = 0

    def acquire_or_renew(self) -> bool:
        self.rounds += 1
        return self.leading.is_set()

    def release(self) -> None:
        pass


def test_a_standby_does_nothing_until_it_leads(submit, settings):
    settings.JOBSITE_SCHEDULER_INTERVAL = 0.1
    settings.JOBSITE_LEADER_RETRY_SECONDS = 0.1
    job = submit("bob", command="true")
    elector = Switch(leading=False)
    loop = SchedulerLoop(elector=elector)
    loop.start()
    try:
        waiting.wait_for(lambda: elector.rounds >= 5, timeout=20, message="five rounds of the standby")
        # A standby still beats (liveness).
        waiting.wait_for(lambda: health.seconds_since_beat() is not None, timeout=20, message="a heartbeat")
        job.refresh_from_db()
        assert job.phase == Phase.SUBMITTED and job.attempts.count() == 0
        assert health.is_leader() is False
        elector.leading.set()
        waiting.wait_for(lambda: job.refresh_from_db() or job.phase == Phase.SUCCEEDED, timeout=30,
                         message=lambda: f"SUCCEEDED, not {job.status}")
        assert health.is_leader() is True
        elector.leading.clear()  # lost the lease: stops acting
        waiting.wait_for(lambda: not loop.leading.is_set(), timeout=20, message="the loop to stop leading")
        second = submit("pan", command="true")
        waiting.wait_for(lambda: elector.rounds >= 20, timeout=20, message="twenty rounds")
        second.refresh_from_db()
        assert second.phase == Phase.SUBMITTED
    finally:
        loop.stop()
        loop.join(10)


# --- a database that ends its connections ---------------------------------------------------------------------


def test_rounds_survive_postgresql_ending_their_connections():
    """The cases of db_termination_cases.py, in a pytest process (and so a test database) of their own: they end
    every connection of their database, which must not reach the connections of this run's other tests."""
    here = Path(__file__).resolve()
    done = subprocess.run([sys.executable, "-m", "pytest", str(here.with_name("db_termination_cases.py")), "-q",
                           "-p", "no:cacheprovider"], cwd=here.parents[2], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]


# --- wake-ups ---------------------------------------------------------------------------------------------------


def test_submits_wake_a_pass_but_no_sync_round_and_a_stop_wakes_both(submit, settings):
    """A burst of submits costs passes only (the rounds as /metrics counts them); a stop needs a sync round, which
    its wake-up asks for. The interval is long: any round after the first was woken."""
    from prometheus_client import REGISTRY

    from jobs import services
    from jobs.models import Group, Job
    from tests.live.conftest import admitted

    def rounds(name: str) -> float:
        return REGISTRY.get_sample_value(f"jobsite_scheduler_{name}_seconds_count") or 0.0

    settings.JOBSITE_SCHEDULER_INTERVAL = 600
    running, _ = admitted(submit("pan", command="sleep 600"))  # held by its attempt; never launched here
    Group.objects.update(queue_stopped=True)  # nothing launched: the submits below are queued, never admitted
    before = rounds("pass"), rounds("sync")
    loop = SchedulerLoop(elector=Switch(leading=True))
    loop.start()
    try:
        waiting.wait_for(lambda: rounds("pass") > before[0] and rounds("sync") > before[1], timeout=60,
                         message="the first pass and sync round")
        start = rounds("pass"), rounds("sync")
        jobs = [submit("bob", command="sleep 600") for _ in range(5)]
        waiting.wait_for(lambda: not Job.objects.filter(pk__in=[j.pk for j in jobs], phase=Phase.SUBMITTED).exists(),
                         timeout=60, message="the submits decided by woken passes")
        assert rounds("pass") > start[0] and rounds("sync") == start[1]
        services.job_terminate(job=Job.objects.get(pk=running.pk), target=Phase.CANCELLED, reason="StoppedByUser",
                               message="stopped")
        waiting.wait_for(lambda: rounds("sync") > start[1], timeout=60, message="a sync round for the stop")
    finally:
        loop.stop()
        loop.join(10)


def test_woken_sync_rounds_run_the_clocks_once_an_interval(submit, settings):
    """Exits wake sync rounds many times a second; the clocks (a backoff over, a TTL due) run in the first round
    of each interval only: a job whose backoff ended after it waits, through woken rounds, for the next interval.
    The interval is long: every round after the first was woken."""
    from datetime import timedelta

    from django.utils import timezone
    from prometheus_client import REGISTRY

    from jobs.models import Job

    def rounds() -> float:
        return REGISTRY.get_sample_value("jobsite_scheduler_sync_seconds_count") or 0.0

    settings.JOBSITE_SCHEDULER_INTERVAL = 600
    before = rounds()
    loop = SchedulerLoop(elector=Switch(leading=True))
    loop.start()
    try:
        waiting.wait_for(lambda: rounds() > before, timeout=60, message="the first sync round")
        job = submit("bob", command="sleep 600")
        Job.objects.filter(pk=job.pk).update(phase=Phase.BACKOFF, status="Error",
                                             retry_at=timezone.now() - timedelta(seconds=1))
        for _ in range(3):
            seen = rounds()
            loop._wake_sync.set()  # as an exit's report does
            waiting.wait_for(lambda seen=seen: rounds() > seen, timeout=60, message="a woken sync round")
        job.refresh_from_db()
        assert job.phase == Phase.BACKOFF
        loop._next_housekeeping = 0.0  # the interval is over
        loop._wake_sync.set()
        waiting.wait_for(lambda: job.refresh_from_db() or job.phase != Phase.BACKOFF, timeout=60,
                         message="the backoff released by the next interval's round")
    finally:
        loop.stop()
        loop.join(10)


def test_a_round_whose_connection_fails_runs_again_up_to_its_tries():
    """Two failures of the database connection (one lost, then none from the pool in its timeout) and the round
    still runs; a third failure fails it, counted once, and scheduling goes on."""
    from django.db import OperationalError
    from prometheus_client import REGISTRY

    from scheduler.loop import ROUND_TRIES

    def count(metric: str) -> float:
        return REGISTRY.get_sample_value(f"jobsite_scheduler_rounds_{metric}_total", {"round": "sync"}) or 0.0

    def failing(times: int):
        calls = []

        def work():
            calls.append(1)
            if len(calls) <= times:
                raise OperationalError("couldn't get a connection after 30.00 sec")
        return work, calls

    loop = SchedulerLoop(elector=Switch(leading=True))
    retried, failed = count("retried"), count("failed")
    work, calls = failing(ROUND_TRIES - 1)
    assert loop._round("sync", work) is True and len(calls) == ROUND_TRIES
    assert (count("retried") - retried, count("failed") - failed) == (ROUND_TRIES - 1, 0)
    work, calls = failing(ROUND_TRIES)
    assert loop._round("sync", work) is False and len(calls) == ROUND_TRIES
    assert count("failed") - failed == 1
