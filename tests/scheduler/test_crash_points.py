"""Crash consistency: one row per point where the scheduler (or the process launching a job) can be killed, from
admission to a running process and through a stop, with what the pure ``reconcile`` of whoever holds the scheduler
next decides. Then the same crash points end to end on the local backend, with the trail each leaves: a job that ran
always has its "Started" event, every transition its event.

A new leader knows nothing of what the old one sent (``stop_sent`` is ""): it reads everything back from the
database and the backend.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from jobs import services
from jobs.choices import Phase
from jobs.models import Job
from scheduler import backend_factory
from scheduler.actuator import get_actuator
from scheduler.backend_factory import get_backend
from scheduler.backends import local as local_backend
from scheduler.launch import launch_spec
from scheduler.passes import schedule_pass
from scheduler.reconcile import (
    FinishTermination,
    JobView,
    Launch,
    RecordStarted,
    RetryOrFail,
    Stop,
    Terminate,
    Timing,
    Transition,
    reconcile,
)
from scheduler.values import ReplicaObservation, ReplicaState

from .conftest import wait_for

pytestmark = pytest.mark.fast

S = ReplicaState
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
TIMING = Timing(preparing_timeout=180, node_lost_grace=300, requeue_limit=5, stuck_after=10, start_timeout=60)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def preparing(**kw) -> JobView:
    base = dict(phase=Phase.PREPARING, status="ContainerCreating", admitted_at=ago(70), attempt_started_at=ago(70),
                updated_at=ago(70), launched_at=ago(70))
    return JobView(**{**base, **kw})


def running(**kw) -> JobView:
    return preparing(**{"phase": Phase.RUNNING, "status": "Running", **kw})


def terminating(**kw) -> JobView:
    return preparing(**{"phase": Phase.TERMINATING, "status": "Terminating", "termination_target": Phase.CANCELLED,
                        "terminating_since": ago(5), "message": "Cancelled by bob", **kw})


def starting(rank=0, present=False) -> ReplicaObservation:
    return ReplicaObservation(rank, S.STARTING, present=present)


def up(rank=0) -> ReplicaObservation:
    return ReplicaObservation(rank, S.RUNNING, present=True)


def exited(rank=0, code=0, present=False) -> ReplicaObservation:
    return ReplicaObservation(rank, S.EXITED, exit_code=code, present=present, finished_at=ago(1))


def lost(rank=0, present=False, message="the supervisor of replica 0 on local never started",
         gone=False) -> ReplicaObservation:
    return ReplicaObservation(rank, S.LOST, present=present, message=message, gone=gone)


NEVER = "Launched 70 s ago, nothing of it started (its launcher was interrupted)"

CRASH_POINTS = [
    # --- admission committed, killed before the launch was claimed ---
    ("after admit, before the launch claim: launched by the next sync",
     preparing(launched=False, launched_at=None), [], [Launch()]),
    ("after admit, cancelled before anyone launched it: ends, nothing to stop",
     terminating(launched=False, launched_at=None), [], [FinishTermination(None)]),
    # --- the launch claimed, killed before any process exists ---
    ("claimed, no process yet, within the start bound: wait",
     preparing(launched_at=ago(30)), [starting()], []),
    ("claimed, no process past the start bound: relaunched as a new attempt at once",
     preparing(), [starting(0), starting(1)],
     [Terminate(Phase.PENDING, "Requeued", f"{NEVER}: requeued (1/5) as a new attempt")]),
    ("claimed, no process past the start bound, requeue limit spent: failed, saying why",
     preparing(requeues=5), [starting()],
     [Terminate(Phase.FAILED, "RequeueLimitExceeded", f"{NEVER}, after 5 requeue(s): giving up")]),
    ("claimed, its supervisor gone before it started: lost (UNKNOWN), not left starting",
     preparing(), [lost()],
     [Transition(Phase.UNKNOWN, reason="NodeUnresponsive", message="the supervisor of replica 0 on local never "
                                                                  "started")]),
    ("claimed, its supervisor never started and nothing of it is left: requeued at once, counted",
     preparing(started_recorded=False), [lost(gone=True)],
     [Terminate(Phase.PENDING, "Requeued", "the supervisor of replica 0 on local never started; nothing of it is "
                                          "left: requeued (1/5) as a new attempt"),
      Stop(force=True, why="replica gone")]),
    ("running, a supervisor died and left nothing: NodeLost at once (no grace: the backend knows), the rest stopped",
     running(), [up(0), lost(1, gone=True, message="the supervisor of replica 1 on local is gone")],
     [Terminate(Phase.PENDING, "NodeLost", "the supervisor of replica 1 on local is gone; nothing of it is left: "
                                           "the attempt failed as NodeLost, requeued at once"),
      Stop(force=True, why="replica gone")]),
    ("running, a supervisor died, its processes still there: UNKNOWN, not requeued under them",
     running(), [up(0), lost(1, present=True, message="gone; 2 of its processes still running")],
     [Transition(Phase.UNKNOWN, reason="NodeUnresponsive", message="gone; 2 of its processes still running")]),
    ("claimed, lost past the grace: requeued once nothing of it is left",
     preparing(phase=Phase.UNKNOWN, updated_at=ago(301)), [lost(message="gone")],
     [Terminate(Phase.PENDING, "NodeLost", "gone; the attempt failed as NodeLost: force-stopping what is left of "
                                          "it, then requeued"), Stop(force=True, why="node lost")]),
    ("requeued, its stop made the late supervisor run nothing: the termination ends",
     terminating(termination_target=Phase.PENDING),
     [lost(message="the supervisor of replica 0 on local was stopped before it started")], [FinishTermination(None)]),
    # --- "Started" is written when a replica is first seen running, never at the launch ---
    ("first seen running: the event, at the time the first replica started, then RUNNING",
     preparing(started_recorded=False), [replace(up(0), started_at=ago(3)), replace(up(1), started_at=ago(2))],
     [RecordStarted(ago(3)), Transition(Phase.RUNNING, message="2 replica(s) running")]),
    ("started, its event missing: the event first, then RUNNING",
     preparing(started_recorded=False), [up()],
     [RecordStarted(), Transition(Phase.RUNNING, message="1 replica(s) running")]),
    ("started and already exited 0, event missing: the event, then SUCCEEDED",
     preparing(started_recorded=False), [exited()],
     [RecordStarted(), Transition(Phase.SUCCEEDED, reason="Completed", message="Exited with code 0",
                                  fields={"exit_code": 0})]),
    ("started and already failed, event missing: the event, then retry or fail",
     preparing(started_recorded=False), [exited(0, 3)],
     [RecordStarted(), RetryOrFail(3, "Attempt 1 failed: the command exited with code 3", failed_rank=0)]),
    ("started, event missing, one rank still starting: the event, nothing else",
     preparing(started_recorded=False), [up(0), starting(1, present=True)], [RecordStarted()]),
    ("no replica started yet, event missing: no event",
     preparing(started_recorded=False, launched_at=ago(5)), [starting(present=True)], []),
    # --- during PREPARING ---
    ("preparing, its supervisor up and starting the command: wait (not 'never started')",
     preparing(), [starting(present=True)], []),
    ("preparing, every replica running: RUNNING", preparing(), [up(0), up(1)],
     [Transition(Phase.RUNNING, message="2 replica(s) running")]),
    ("preparing past the preparing timeout with its processes there: requeued with a delay, stopped first",
     preparing(attempt_started_at=ago(200)), [starting(present=True)],
     [Terminate(Phase.PENDING, "Requeued", "Still preparing after 200 s: requeued (1/5), eligible again in 60 s",
                retry_at=NOW + timedelta(seconds=60))]),
    # --- the job exited, killed before the exit was recorded ---
    ("exited 0 while nobody was watching: SUCCEEDED", running(), [exited()],
     [Transition(Phase.SUCCEEDED, reason="Completed", message="Exited with code 0", fields={"exit_code": 0})]),
    ("exited 3 while nobody was watching: retry or fail with its code", running(), [exited(0, 3)],
     [RetryOrFail(3, "Attempt 1 failed: the command exited with code 3", failed_rank=0)]),
    # --- during TERMINATING ---
    ("stop decided, killed before it was sent: sent by the next leader", terminating(), [up()],
     [Stop(force=False, why="graceful")]),
    ("stop sent by the dead leader, processes still there past the bound: forced by the next one at once",
     terminating(terminating_since=ago(30)), [up()], [Stop(force=True, why="still there 30 s after the stop")]),
    ("stop sent, processes already gone: finished", terminating(terminating_since=ago(30)), [exited(0, 143)],
     [FinishTermination(143)]),
    ("stop sent, supervisor gone but its processes live: stopped again", terminating(),
     [lost(present=True, message="the supervisor of replica 0 on local is gone; 1 of its processes still running")],
     [Stop(force=True, why="node lost")]),
    ("forced by this leader, still there: wait", terminating(stop_sent="forced", terminating_since=ago(15)),
     [up()], []),
    ("forced long ago, still there: given up on, said so (bounded)",
     terminating(stop_sent="forced", terminating_since=ago(21)), [up()],
     [FinishTermination(None, abandoned="replica(s) 0 still there 21 s after being killed: given up on, resources "
                                        "released")]),
    ("a failed attempt's stop taken over: once gone, retried by its first failure",
     terminating(termination_target=Phase.BACKOFF, exit_code=5, failed_rank=1,
                 message="Attempt 1 failed: rank 1 exited with code 5; stopping the other replicas"),
     [exited(0, 143), exited(1, 5)],
     [RetryOrFail(5, "Attempt 1 failed: rank 1 exited with code 5", failed_rank=1)]),
    # --- the scheduler killed while another takes the leadership ---
    ("new leader, a running job: nothing to do", running(), [up()], []),
    ("new leader, a job past its deadline: stopped as TIMED_OUT", running(active_deadline_seconds=60), [up()],
     [Terminate(Phase.TIMED_OUT, "DeadlineExceeded", "Ran past its deadline of 60 s")]),
]


@pytest.mark.parametrize("view, seen, expected", [c[1:] for c in CRASH_POINTS], ids=[c[0] for c in CRASH_POINTS])
def test_crash_point(view, seen, expected):
    assert reconcile(view, seen, NOW, TIMING) == expected


# --- end to end on the local backend: the trail each crash point leaves -------------------------------------------


def reasons(job, attempt_number=None):
    events = job.events.order_by("id")
    if attempt_number is not None:
        events = events.filter(attempt__number=attempt_number)
    return list(events.values_list("reason", flat=True))


def ran(trail):
    """A trail less "Running": a short command is seen running or not, as a sync happens to look while it runs."""
    return [reason for reason in trail if reason != "Running"]


def admitted_unlaunched(submit, **spec):
    """A job admitted by a pass whose after-commit launch never ran (its scheduler was killed)."""
    job = submit("bob", "gpu-1", **spec)
    schedule_pass()  # the test transaction never commits: the launch hook does not run
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING and job.current_attempt.launched_at is None
    return job


@pytest.mark.slow
@pytest.mark.django_db
def test_killed_after_admission_the_next_sync_launches_it(submit, clock):
    job = admitted_unlaunched(submit, command="echo hi")
    wait_for(job, {Phase.SUCCEEDED}, clock)
    trail = reasons(job)
    assert trail[0] == "Submitted" and ran(trail[trail.index("Admitted"):]) == ["Admitted", "Started", "Completed"]


@pytest.mark.slow
@pytest.mark.django_db
def test_killed_after_the_launch_claim_the_attempt_is_relaunched_as_a_new_one(submit, clock, settings):
    """Nothing of it was ever launched, which the backend can tell (no launch under way here, none on disk): requeued
    at once, not after the start timeout (issue 21: a scheduler killed as it launched held the GPUs a minute)."""
    settings.JOBSITE_LOCAL_START_TIMEOUT_SECONDS = 3600
    job = admitted_unlaunched(submit, command="echo hi")
    assert services.attempt_claim_launch(attempt=job.current_attempt)  # ... and then the launcher died
    wait_for(job, {Phase.SUCCEEDED}, clock, timeout=60)
    assert job.current_attempt.number == 2
    first = job.attempts.get(number=1)
    assert first.outcome == "Requeued"
    assert reasons(job, 1)[-2:] == ["Requeued", "Terminated"]
    assert "nothing of it started" in job.events.get(reason="Requeued").message
    assert ran(reasons(job, 2)) == ["Admitted", "Started", "Completed"]
    # attempt 1 never ran
    assert not backend_factory.local_backend().log_path(job_id=job.pk, attempt_number=1, rank=0).exists()


@pytest.mark.slow
@pytest.mark.django_db
def test_an_attempt_that_never_ran_has_no_started_event(submit, clock, settings, monkeypatch, tmp_path):
    """Its supervisor could not start (here: no supervisor script): launched, lost, never "Started" (issue 21)."""
    settings.JOBSITE_LOCAL_START_TIMEOUT_SECONDS = 1
    monkeypatch.setattr(local_backend, "RUNNER", tmp_path / "no-such-supervisor.py")
    job = submit("bob", "gpu-1", command="echo hi")
    wait_for(job, {Phase.FAILED}, clock, timeout=120)
    # Each attempt requeued at once (nothing of it was left: no node-lost grace to wait out), then given up on.
    assert (job.reason, job.attempts.count()) == ("RequeueLimitExceeded", 6)
    assert list(job.attempts.values_list("outcome", flat=True).order_by("number"))[:5] == ["Requeued"] * 5
    assert "Started" not in reasons(job) and "NodeUnresponsive" not in reasons(job)


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.parametrize("command, phase", [("sleep 600", Phase.RUNNING), ("echo done", Phase.SUCCEEDED),
                                            ("exit 3", Phase.FAILED)])
def test_killed_after_the_process_started_the_trail_still_has_started(submit, clock, command, phase):
    job = admitted_unlaunched(submit, command=command, backoff_limit=0)
    attempt = job.current_attempt
    backend = get_backend()
    assert services.attempt_claim_launch(attempt=attempt)
    backend.launch(launch_spec(job, attempt))  # started; the launcher died before it wrote "Started"
    wait_for(job, {phase}, clock)
    assert reasons(job).count("Started") == 1
    assert reasons(job).index("Started") == reasons(job).index("Admitted") + 1
    if phase == Phase.RUNNING:
        services.job_cancel(job=job, by=job.user)
        wait_for(job, {Phase.CANCELLED}, clock)


@pytest.mark.slow
@pytest.mark.django_db
def test_a_stop_the_dead_leader_sent_is_finished_by_the_next_one(submit, clock, settings, tmp_path):
    settings.JOBSITE_LOCAL_SANDBOX = "off"  # unsandboxed: the job writes its pid into the test's directory
    job = submit("bob", "gpu-1", command='trap "" TERM; echo $$ > "$FLAGS/pid"; while :; do sleep 0.2; done',
                 env={"FLAGS": str(tmp_path)})
    wait_for(job, {Phase.RUNNING}, clock)
    deadline = time.monotonic() + 30
    while not (tmp_path / "pid").exists() and time.monotonic() < deadline:
        clock()
    pid = int((tmp_path / "pid").read_text())
    services.job_cancel(job=job, by=job.user)
    clock()  # the leader sends its graceful stop (ignored: TERM is trapped) ...
    # ... and is killed: the next leader has no memory of that stop, and finds it older than the bound.
    settings.JOBSITE_TERMINATION_GRACE_SECONDS = 1
    get_actuator(get_backend()).forget(set())
    job.refresh_from_db()
    Job.objects.filter(pk=job.pk).update(terminating_since=job.terminating_since - timedelta(seconds=60))
    wait_for(job, {Phase.CANCELLED}, clock)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    assert reasons(job)[-1] == "Terminated" and "given up" not in job.message
