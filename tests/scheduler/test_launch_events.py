"""Launch overhead of the local backend: a launch does not wait for its supervisor, and a replica's exit is noticed
by an event (its supervisor's datagram to the leading scheduler), not at the next periodic sync."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jobs import services
from jobs.choices import Phase
from scheduler.backend_factory import get_backend
from scheduler.backends import local as local_backend
from scheduler.backends.local import ExitEvents
from scheduler.backends.local_runner import notify
from scheduler.launch import attempt_launch, launch_spec
from scheduler.loop import SchedulerLoop
from scheduler.passes import schedule_pass
from scheduler.values import ReplicaState
from tests import waiting

from .conftest import wait_for

# Generous: the machine running the tests is shared and busy.
DEADLINE = 20.0


class Leading:
    """An elector whose answer the test sets."""

    identity = "test-scheduler"

    def __init__(self, leading: bool = True):
        self.leading = threading.Event()
        if leading:
            self.leading.set()
        self.rounds = 0

    def acquire_or_renew(self) -> bool:
        self.rounds += 1
        return self.leading.is_set()

    def release(self) -> None:
        pass


def state_dir(job, attempt: int = 1, rank: int = 0) -> Path:
    return get_backend().root / "state" / f"job-{job.pk}" / f"attempt-{attempt}" / f"replica-{rank}"


# --- the supervisor's datagram -------------------------------------------------------------------------------------


def test_the_supervisor_reports_its_exit_after_writing_the_exit_code(tmp_path):
    state, work = tmp_path / "state", tmp_path / "work"
    state.mkdir()
    work.mkdir()
    events = ExitEvents(tmp_path / "events.sock")
    try:
        subprocess.run([sys.executable, str(local_backend.RUNNER), "--grace", "1", "--notify", str(events.path),
                        str(state), str(tmp_path / "replica.log"), str(work), "--", "/bin/sh", "-c", "exit 7"],
                       check=True, timeout=60)
        assert events.wait(DEADLINE)
        # The exit it reports is there to read when the datagram arrives.
        assert (state / "exit_code").read_text() == "7"
        assert not events.wait(0)  # one datagram, read once
    finally:
        events.close()
    assert not events.path.exists()


def test_a_socket_path_longer_than_sun_path_still_works(tmp_path):
    deep = tmp_path / ("d" * 100) / "state"
    events = ExitEvents(deep / "events.sock")
    try:
        assert len(str(events.path)) > 108
        assert notify(events.path)
        assert events.wait(DEADLINE)
    finally:
        events.close()
    assert not notify(events.path)  # nobody listens: the sender is told, never blocked


def test_a_new_listener_takes_the_name_over_and_the_old_one_leaves_it(tmp_path):
    old = ExitEvents(tmp_path / "events.sock")
    new = ExitEvents(tmp_path / "events.sock")  # the next leader, while the old socket is still open
    try:
        old.close()  # the old leader's close must not remove the new leader's socket
        assert new.path.exists()
        assert notify(new.path)
        assert new.wait(DEADLINE)
    finally:
        new.close()


# --- launch does not block on the supervisor ------------------------------------------------------------------------


GATED_RUNNER = """\
import os, sys, time
while not os.path.exists({gate!r}):
    time.sleep(0.02)
os.execv(sys.executable, [sys.executable, {runner!r}, *sys.argv[1:]])
"""


@pytest.fixture
def gated_runner(tmp_path, monkeypatch):
    """The supervisor starts only once the test opens the gate (a file): a launch that waited for it would hang."""
    gate = tmp_path / "gate"
    script = tmp_path / "gated_runner.py"
    script.write_text(GATED_RUNNER.format(gate=str(gate), runner=str(local_backend.RUNNER)))
    monkeypatch.setattr(local_backend, "RUNNER", script)
    yield gate
    gate.touch()  # no launcher left waiting: each goes on to its supervisor, which ends with its command
    for launcher in get_backend()._launchers:
        launcher.wait(timeout=60)


@pytest.mark.django_db
def test_launch_returns_before_the_supervisor_has_started(submit, clock, gated_runner):
    job = submit("bob", "gpu-1", command="echo started late")
    schedule_pass()  # the test transaction never commits: the launch is the test's own call below
    job.refresh_from_db()
    attempt = job.current_attempt
    assert services.attempt_claim_launch(attempt=attempt)
    backend = get_backend()
    began = time.monotonic()
    backend.launch(launch_spec(job, attempt))
    assert time.monotonic() - began < DEADLINE
    state = state_dir(job)
    assert (state / "launched").exists() and not (state / "runner.pid").exists()
    [seen] = backend.observe(job_id=job.pk, attempt_number=1, replicas=1)
    assert seen.state == ReplicaState.STARTING
    gated_runner.touch()
    wait_for(job, {Phase.SUCCEEDED}, clock, timeout=60)
    assert backend.log_path(job_id=job.pk, attempt_number=1, rank=0).read_text() == "started late\n"


@pytest.mark.django_db
def test_a_supervisor_that_never_starts_is_still_detected(submit, clock, settings, gated_runner):
    settings.JOBSITE_LOCAL_START_TIMEOUT_SECONDS = 1
    job = submit("bob", "gpu-1", command="echo never")
    schedule_pass()
    job.refresh_from_db()
    attempt_launch(job.pk, backend=get_backend())  # claimed, launched, recorded; its supervisor waits at the gate
    job.refresh_from_db()
    assert job.current_attempt.launched_at is not None
    wait_for(job, {Phase.UNKNOWN, Phase.RUNNING, Phase.SUCCEEDED}, clock, timeout=60)
    assert (job.phase, job.reason) == (Phase.UNKNOWN, "NodeUnresponsive")
    assert "never started" in job.message


# --- the scheduler loop syncs on an exit -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_exit_is_noticed_long_before_the_sync_interval(submit, settings):
    settings.JOBSITE_SCHEDULER_INTERVAL = 30.0  # the periodic sync would notice it only after 30 s
    settings.JOBSITE_LEADER_RETRY_SECONDS = 0.1
    elector = Leading(leading=False)
    loop = SchedulerLoop(elector=elector)
    sock = get_backend().events_path
    loop.start()
    try:
        waiting.wait_for(lambda: elector.rounds >= 3, timeout=DEADLINE, message="three rounds of the standby")
        assert not sock.exists()  # a standby binds nothing: no report goes to a scheduler that would not act on it
        elector.leading.set()
        waiting.wait_for(sock.exists, timeout=DEADLINE, message="the leader's event socket")
        job = submit("bob", "gpu-1", command="true")  # the submit wakes admission, which launches it
        began = time.monotonic()
        waiting.wait_for(lambda: job.refresh_from_db() or job.phase == Phase.SUCCEEDED, timeout=DEADLINE,
                         message=lambda: f"SUCCEEDED, not {job.status}")
        assert time.monotonic() - began < DEADLINE < settings.JOBSITE_SCHEDULER_INTERVAL
        second = submit("pan", "gpu-1", command="exit 4", backoff_limit=0)
        waiting.wait_for(lambda: second.refresh_from_db() or second.phase == Phase.FAILED, timeout=DEADLINE,
                         message=lambda: f"FAILED, not {second.status}")
        assert second.exit_code == 4
        elector.leading.clear()  # a standby again: it leaves the socket
        waiting.wait_for(lambda: not sock.exists(), timeout=DEADLINE, message="the standby to leave the socket")
    finally:
        loop.stop()
        loop.join(DEADLINE)
    assert not loop.is_alive()
