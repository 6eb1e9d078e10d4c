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
