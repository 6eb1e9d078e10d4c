"""reconcile(): what replica observations mean for a job, table-tested like decide() (no database, no backend)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.choices import JobType, Phase
from scheduler.reconcile import (
    CountRestart,
    Fate,
    FinishTermination,
    JobView,
    Launch,
    Relaunch,
    RetryOrFail,
    Stop,
    Terminate,
    Timing,
    Transition,
    attempt_fate,
    reconcile,
)
from scheduler.values import ReplicaObservation, ReplicaState

pytestmark = pytest.mark.fast

S = ReplicaState
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
TIMING = Timing(preparing_timeout=180, node_lost_grace=300, requeue_limit=5, stuck_after=630)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def job(**kw) -> JobView:
    base = dict(phase=Phase.RUNNING, status="Running", admitted_at=ago(60), attempt_started_at=ago(60),
                updated_at=ago(10))
    return JobView(**{**base, **kw})


def r(rank=0, state=S.RUNNING, **kw) -> ReplicaObservation:
    return ReplicaObservation(rank, state, **kw)


def exited(rank=0, code=0, **kw) -> ReplicaObservation:
    return ReplicaObservation(rank, S.EXITED, exit_code=code, **kw)


CASES = [
    # --- launch ---
    ("admitted, never launched: launch", job(phase=Phase.PREPARING, launched=False), [], [Launch()]),
    ("cancelled before its launch: nothing to start, it ends",
     job(phase=Phase.TERMINATING, launched=False, termination_target=Phase.CANCELLED), [], [FinishTermination(None)]),
    # --- PREPARING / RUNNING ---
    ("all replicas running: RUNNING", job(phase=Phase.PREPARING, status="ContainerCreating"), [r(0), r(1)],
     [Transition(Phase.RUNNING, message="2 replica(s) running")]),
    ("running on a node: named", job(phase=Phase.PREPARING, node="gpu-a"), [r()],
     [Transition(Phase.RUNNING, message="1 replica(s) running on gpu-a")]),
    ("already RUNNING: nothing", job(), [r()], []),
    ("one still starting: stays PREPARING", job(phase=Phase.PREPARING, status="ContainerCreating"),
     [r(0), r(1, S.STARTING, status="ContainerCreating")], []),
    ("finer status shown", job(phase=Phase.PREPARING, status="ContainerCreating"),
     [r(0, S.STARTING, status="ErrImagePull", message="pull failed")],
     [Transition(Phase.PREPARING, status="ErrImagePull", message="pull failed")]),
    # --- the status of the slowest replica ---
    ("one rank running, one not placed: Pending", job(phase=Phase.PREPARING, status="ContainerCreating"),
     [r(0), r(1, S.STARTING, status="Pending", message="0/4 nodes are available")],
     [Transition(Phase.PREPARING, status="Pending", message="0/4 nodes are available")]),
    ("one rank creating, one running: ContainerCreating", job(phase=Phase.PREPARING, status="Pending"),
     [r(0, S.STARTING, status="ContainerCreating"), r(1)],
     [Transition(Phase.PREPARING, status="ContainerCreating")]),
    ("init containers counted over every replica", job(phase=Phase.PREPARING, status="Pending"),
     [r(0, S.STARTING, status="Init:1/2"), r(1, S.STARTING, status="ContainerCreating"),
      r(2, S.STARTING, status="Init:0/2")],
     [Transition(Phase.PREPARING, status="Init:3/6")]),
    ("a problem on any rank comes first", job(phase=Phase.PREPARING, status="Init:1/4"),
     [r(0, S.STARTING, status="Init:1/2"), r(1, S.STARTING, status="ImagePullBackOff", message="back-off")],
     [Transition(Phase.PREPARING, status="ImagePullBackOff", message="back-off")]),
    ("slowest unchanged: nothing", job(phase=Phase.PREPARING, status="Pending"),
     [r(0, S.STARTING, status="Pending"), r(1, S.STARTING, status="Init:0/1")], []),
    ("preparing past the timeout: requeued with a delay",
     job(phase=Phase.PREPARING, status="ContainerCreating", attempt_started_at=ago(200), requeues=1),
     [r(0, S.STARTING, status="ContainerCreating")],
     [Terminate(Phase.PENDING, "Requeued", "Still preparing after 200 s: requeued (2/5), eligible again in 120 s",
                retry_at=NOW + timedelta(seconds=120))]),
    ("preparing past the timeout, requeue limit spent: FAILED",
     job(phase=Phase.PREPARING, status="ContainerCreating", attempt_started_at=ago(200), requeues=5),
     [r(0, S.STARTING, status="ContainerCreating")],
     [Terminate(Phase.FAILED, "RequeueLimitExceeded", "Still preparing after 200 s, after 5 requeue(s): giving up")]),
    ("past the active deadline: TIMED_OUT", job(active_deadline_seconds=30), [r()],
     [Terminate(Phase.TIMED_OUT, "DeadlineExceeded", "Ran past its deadline of 30 s")]),
    # --- endings ---
    ("every replica exited 0: SUCCEEDED", job(), [exited(0), exited(1)],
     [Transition(Phase.SUCCEEDED, reason="Completed", message="All replicas exited with code 0",
                 fields={"exit_code": 0})]),
    ("single replica exited 0", job(), [exited(0)],
     [Transition(Phase.SUCCEEDED, reason="Completed", message="Exited with code 0", fields={"exit_code": 0})]),
    ("exited non-zero: retry or fail with its code", job(), [exited(0, 3, status="Error")],
     [RetryOrFail(3, "Attempt 1 failed: the command exited with code 3 (Error)", failed_rank=0)]),
    ("over its memory: OOMKilled, as Kubernetes says it (counted against the backoff like an error)", job(),
     [exited(0, 137, status="OOMKilled")],
     [RetryOrFail(137, "Attempt 1 failed: the command exited with code 137 (OOMKilled, killed by SIGKILL)",
                  failed_rank=0, reason="OOMKilled")]),
    ("a rank over its memory while the others run: stopped, then retried as OOMKilled", job(),
     [r(0), exited(1, 137, status="OOMKilled")],
     [Terminate(Phase.BACKOFF, "OOMKilled", "Attempt 1 failed: rank 1 exited with code 137 (OOMKilled, killed by "
                                            "SIGKILL); stopping the other replicas", exit_code=137, failed_rank=1)]),
    ("the others stopped after an OOM kill: retry or fail as OOMKilled",
     job(phase=Phase.TERMINATING, termination_target=Phase.BACKOFF, stop_sent="graceful", exit_code=137,
         failed_rank=1, reason="OOMKilled", message="Attempt 1 failed: rank 1 exited; stopping the other replicas"),
     [exited(0, 143), exited(1, 137, status="OOMKilled")],
     [RetryOrFail(137, "Attempt 1 failed: rank 1 exited", failed_rank=1, reason="OOMKilled")]),
    # --- one attempt, one fate: the first failing rank decides, whatever the timing ---
    ("one rank failed early while the other runs: stop it, then retry", job(attempt_number=2),
     [r(0), exited(1, 5, finished_at=ago(1))],
     [Terminate(Phase.BACKOFF, "Error", "Attempt 2 failed: rank 1 exited with code 5; stopping the other replicas",
                exit_code=5, failed_rank=1)]),
    ("one rank failed while the other is still starting: same", job(phase=Phase.PREPARING),
     [r(0, S.STARTING, status="ContainerCreating"), exited(1, 5)],
     [Terminate(Phase.BACKOFF, "Error", "Attempt 1 failed: rank 1 exited with code 5; stopping the other replicas",
                exit_code=5, failed_rank=1)]),
    ("all failed together (same instant): the lowest rank", job(),
     [exited(0, 1, finished_at=ago(2)), exited(1, 5, finished_at=ago(2)), exited(2, 7, finished_at=ago(2))],
     [RetryOrFail(1, "Attempt 1 failed: rank 0 exited with code 1", failed_rank=0)]),
    ("all failed, rank 2 first: rank 2's code", job(),
     [exited(0, 1, finished_at=ago(1)), exited(1, 5, finished_at=ago(2)), exited(2, 7, finished_at=ago(3))],
     [RetryOrFail(7, "Attempt 1 failed: rank 2 exited with code 7", failed_rank=2)]),
    ("one failed after the others succeeded", job(),
     [exited(0, 0, finished_at=ago(9)), exited(1, 5, finished_at=ago(1)), exited(2, 0, finished_at=ago(8))],
     [RetryOrFail(5, "Attempt 1 failed: rank 1 exited with code 5", failed_rank=1)]),
    ("one killed by a signal: named", job(), [r(0), exited(1, 137)],
     [Terminate(Phase.BACKOFF, "Error", "Attempt 1 failed: rank 1 exited with code 137 (killed by SIGKILL); "
                                        "stopping the other replicas", exit_code=137, failed_rank=1)]),
    ("a failed attempt, the others stopped: retry or fail with the first failure's code, not theirs (143)",
     job(phase=Phase.TERMINATING, termination_target=Phase.BACKOFF, stop_sent="graceful", exit_code=5,
         failed_rank=1, message="Attempt 1 failed: rank 1 exited with code 5; stopping the other replicas"),
     [exited(0, 143, finished_at=ago(1)), exited(1, 5, finished_at=ago(5))],
     [RetryOrFail(5, "Attempt 1 failed: rank 1 exited with code 5", failed_rank=1)]),
    ("a failed attempt, others still stopping: wait",
     job(phase=Phase.TERMINATING, termination_target=Phase.BACKOFF, stop_sent="graceful", exit_code=5,
         failed_rank=1, terminating_since=ago(3)),
     [r(0, present=True, status="Terminating"), exited(1, 5)], []),
    ("interactive: one replica failed, others run: nothing yet (restarted when all end)",
     job(job_type=JobType.INTERACTIVE), [r(0), exited(1, 5)], []),
    ("cannot run at all (bad image): FAILED without retry", job(phase=Phase.PREPARING),
     [r(0, S.FAILED, status="ErrImagePull", reason="FailedImagePull", message="no such image")],
     [Terminate(Phase.FAILED, "FailedImagePull", "no such image", failed_rank=0)]),
    ("evicted", job(), [r(0, S.FAILED, status="Evicted", reason="Evicted", message="evicted from gpu-a")],
     [Terminate(Phase.FAILED, "Evicted", "evicted from gpu-a", failed_rank=0)]),
    # --- interactive ---
    ("interactive ended: CrashLoopBackOff with a delay", job(job_type=JobType.INTERACTIVE), [exited(0, 2)],
     [CountRestart(), Transition(Phase.RUNNING, status="CrashLoopBackOff", reason="CrashLoopBackOff",
                                 message="The command exited with code 2; restart #1 in 10 s",
                                 fields={"exit_code": 2, "retry_at": NOW + timedelta(seconds=10)})]),
    ("interactive, third restart: 40 s", job(job_type=JobType.INTERACTIVE, restarts=2), [exited(0, 0)],
     [CountRestart(), Transition(Phase.RUNNING, status="CrashLoopBackOff", reason="CrashLoopBackOff",
                                 message="The command exited with code 0; restart #3 in 40 s",
                                 fields={"exit_code": 0, "retry_at": NOW + timedelta(seconds=40)})]),
    ("interactive waiting out its delay", job(job_type=JobType.INTERACTIVE, status="CrashLoopBackOff",
                                             retry_at=NOW + timedelta(seconds=5)), [exited(0, 2)], []),
    ("interactive delay over: relaunched in place",
     job(job_type=JobType.INTERACTIVE, status="CrashLoopBackOff", retry_at=ago(1), restarts=1), [exited(0, 2)],
     [Transition(Phase.RUNNING, reason="Restarted", message="Restarted in place (restart #1)",
                 fields={"retry_at": None}), Relaunch()]),
    # --- lost node ---
    ("a replica lost: UNKNOWN", job(), [r(0), r(1, S.LOST, message="node gpu-a is unresponsive")],
     [Transition(Phase.UNKNOWN, reason="NodeUnresponsive", message="node gpu-a is unresponsive")]),
    ("UNKNOWN within the grace: wait", job(phase=Phase.UNKNOWN, updated_at=ago(100)),
     [r(0, S.LOST, message="lost")], []),
    ("UNKNOWN past the grace: NodeLost, force-stopped, requeued once gone",
     job(phase=Phase.UNKNOWN, updated_at=ago(301)), [r(0, S.LOST, message="lost")],
     [Terminate(Phase.PENDING, "NodeLost", "lost; the attempt failed as NodeLost: force-stopping what is left of "
                                           "it, then requeued"), Stop(force=True, why="node lost")]),
    ("NodeLost, its processes still there: wait (its GPUs stay held)",
     job(phase=Phase.TERMINATING, termination_target=Phase.PENDING, stop_sent="forced", terminating_since=ago(5)),
     [r(0, S.LOST, present=True)], []),
    ("terminating a lost replica, no stop sent yet (scheduler restarted): forced at once",
     job(phase=Phase.TERMINATING, termination_target=Phase.PENDING, terminating_since=ago(5)),
     [r(0, S.LOST, present=True)], [Stop(force=True, why="node lost")]),
    ("forced long ago and still there: given up on, said so (bounded)",
     job(phase=Phase.TERMINATING, termination_target=Phase.CANCELLED, stop_sent="forced",
         terminating_since=ago(1300)),
     [r(0, S.RUNNING, present=True), exited(1, 137)],
     [FinishTermination(137, abandoned="replica(s) 0 still there 1300 s after being killed: given up on, "
                                       "resources released")]),
    ("a failed attempt given up on is still retried by its first failure",
     job(phase=Phase.TERMINATING, termination_target=Phase.BACKOFF, stop_sent="forced", exit_code=5, failed_rank=1,
         terminating_since=ago(1300), message="Attempt 1 failed: rank 1 exited with code 5; stopping the other "
                                               "replicas"),
     [r(0, S.RUNNING, present=True), exited(1, 5)],
     [RetryOrFail(5, "Attempt 1 failed: rank 1 exited with code 5; replica(s) 0 still there 1300 s after being "
                     "killed: given up on, resources released", failed_rank=1)]),
    ("UNKNOWN and back running: RUNNING", job(phase=Phase.UNKNOWN), [r()],
     [Transition(Phase.RUNNING, message="1 replica(s) running")]),
    # --- TERMINATING: graceful, then force only when lost or stuck ---
    ("terminating, stop not sent: graceful stop", job(phase=Phase.TERMINATING, terminating_since=ago(1)),
     [r(present=True)], [Stop(force=False, why="graceful")]),
    ("terminating, stop sent, within grace + stuck timeout: wait (no force because a grace elapsed)",
     job(phase=Phase.TERMINATING, terminating_since=ago(60), stop_sent="graceful"),
     [r(present=True, status="Terminating")], []),
    ("terminating, container ended but the pod is still there: wait",
     job(phase=Phase.TERMINATING, terminating_since=ago(5), stop_sent="graceful"),
     [exited(0, 143, present=True)], []),
    ("terminating, stuck past the timeout: force", job(phase=Phase.TERMINATING, terminating_since=ago(700),
                                                      stop_sent="graceful"),
     [r(present=True)], [Stop(force=True, why="still there 700 s after the stop")]),
    ("terminating on a lost node: force", job(phase=Phase.TERMINATING, terminating_since=ago(5),
                                             stop_sent="graceful"),
     [r(0, S.LOST, present=True, message="node gone")], [Stop(force=True, why="node lost")]),
    ("terminating, already forced: wait", job(phase=Phase.TERMINATING, terminating_since=ago(700),
                                             stop_sent="forced"), [r(present=True)], []),
    ("terminating, every replica gone: finished with the first non-zero code",
     job(phase=Phase.TERMINATING, terminating_since=ago(5), stop_sent="graceful"),
     [exited(0, 0), exited(1, 143)], [FinishTermination(143)]),
    ("terminating, pods vanished (no exit code)", job(phase=Phase.TERMINATING, stop_sent="graceful"),
     [r(0, S.LOST, message="pod vanished")], [FinishTermination(None)]),
]


@pytest.mark.parametrize("view, seen, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_reconcile(view, seen, expected):
    assert reconcile(view, seen, NOW, TIMING) == expected


FATES = [
    ("nothing ended", [r(0), r(1)], Fate()),
    ("some exited 0, one running", [exited(0), r(1)], Fate()),
    ("every one exited 0", [exited(0), exited(1)], Fate(succeeded=True, exit_code=0)),
    ("one failed, the rest running", [r(0), exited(1, 5)],
     Fate(failed=True, rank=1, exit_code=5, message="rank 1 exited with code 5", reason="Error")),
    ("the earliest failure wins over the lowest rank",
     [exited(0, 143, finished_at=ago(1)), exited(1, 5, finished_at=ago(2))],
     Fate(failed=True, rank=1, exit_code=5, message="rank 1 exited with code 5", reason="Error")),
    ("a failure with a time before one without", [exited(0, 2), exited(1, 3, finished_at=ago(1))],
     Fate(failed=True, rank=1, exit_code=3, message="rank 1 exited with code 3", reason="Error")),
    ("single replica", [exited(0, 9)],
     Fate(failed=True, rank=0, exit_code=9, message="the command exited with code 9", reason="Error")),
    ("no replicas seen", [], Fate()),
]


@pytest.mark.parametrize("seen, expected", [c[1:] for c in FATES], ids=[c[0] for c in FATES])
def test_attempt_fate(seen, expected):
    assert attempt_fate(seen) == expected
