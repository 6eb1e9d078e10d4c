"""What the observations of an attempt's replicas mean for its job: a pure function, table-tested like ``decide``.

``reconcile(job, replicas, now, timing)`` takes what the database says of a job holding resources (``JobView``),
what the backend says of each replica of its current attempt (``ReplicaObservation``) and the time, and returns the
actions that bring the job in line: transitions for the ``jobs`` services, and stops, launches and relaunches for the
backend. No ORM, no I/O, no clock; ``scheduler.sync`` reads the inputs and applies the actions.

The rules, in order (DESIGN.md §2–3):
- an attempt admitted but never launched is launched;
- TERMINATING: done (→ its target) once no replica is left; until then the replicas are stopped with the job's grace
  period, once; force-stopped only when a replica's node is lost or they are still there ``stuck_after`` seconds
  after the stop (never merely because a grace period elapsed on our side);
- a lost replica makes the job UNKNOWN; after ``node_lost_grace`` the attempt fails as NodeLost, its replicas are
  force-stopped and the job is requeued without spending its backoff;
- a replica that cannot run at all fails the job (no retry);
- interactive jobs restart in place (CrashLoopBackOff, growing delay) when all replicas ended;
- all replicas ended: success when every one exited 0, else retry or fail with the first failing one's exit code;
- one replica of a training job failed while others run: the attempt failed, the others are stopped;
- past the active deadline: TIMED_OUT; all replicas running: RUNNING; still preparing past the timeout: requeued
  (growing delay) or, past the requeue limit, FAILED; otherwise the finer status the backend shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from jobs.choices import JobType, Phase
from jobs.rules import requeue_delay, restart_delay

from .backends.base import ReplicaObservation, ReplicaState

S = ReplicaState


@dataclass(frozen=True)
class Timing:
    preparing_timeout: float = 180
    node_lost_grace: float = 300
    requeue_limit: int = 5
    stuck_after: float = 600  # seconds after a graceful stop before replicas still there are force-stopped


@dataclass(frozen=True)
class JobView:
    """What reconcile needs of a job holding resources and of its current attempt."""

    phase: str
    status: str = ""
    job_type: str = JobType.TRAINING
    terminating_since: datetime | None = None
    admitted_at: datetime | None = None
    active_deadline_seconds: int = 86400
    retry_at: datetime | None = None
    updated_at: datetime | None = None  # for UNKNOWN: since when
    attempt_started_at: datetime | None = None
    launched: bool = True
    node: str = ""
    restarts: int = 0  # in-place restarts of the attempt so far
    requeues: int = 0  # attempts of the job requeued so far
    stop_sent: str = ""  # "", "graceful" or "forced": what the scheduler already asked of the backend


# --- actions -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """Start the attempt's replicas (admitted, never launched)."""


@dataclass(frozen=True)
class Stop:
    force: bool = False
    why: str = ""


@dataclass(frozen=True)
class Relaunch:
    """Start the replicas of the current attempt again, in place (after the transition has committed)."""


@dataclass(frozen=True)
class CountRestart:
    """One more in-place restart of the attempt (bookkeeping, no event)."""


@dataclass(frozen=True)
class Transition:
    phase: str
    reason: str = ""
    message: str = ""
    status: str | None = None
    event_reason: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)  # exit_code, retry_at, ...


@dataclass(frozen=True)
class Terminate:
    """Start stopping the attempt; the job ends in ``target`` once its replicas are gone."""

    target: str
    reason: str
    message: str
    retry_at: datetime | None = None


@dataclass(frozen=True)
class RetryOrFail:
    """The attempt failed by its own exit: back off and retry while the backoff limit allows, else FAILED."""

    exit_code: int | None
    message: str


@dataclass(frozen=True)
class FinishTermination:
    exit_code: int | None


Action = Launch | Stop | Relaunch | CountRestart | Transition | Terminate | RetryOrFail | FinishTermination

ENDED = frozenset({S.EXITED, S.LOST})


def reconcile(job: JobView, seen: list[ReplicaObservation], now: datetime, timing: Timing) -> list[Action]:
    if not job.launched:
        return [Launch()]
    if job.phase == Phase.TERMINATING:
        return _terminating(job, seen, now, timing)

    states = {o.state for o in seen}
    ended = [o for o in seen if o.state in ENDED]
    failed = [o for o in seen if o.state == S.EXITED and o.exit_code != 0]

    lost = [o for o in seen if o.state == S.LOST]
    if lost:
        message = "; ".join(o.message for o in lost)
        if job.phase != Phase.UNKNOWN:
            return [Transition(Phase.UNKNOWN, reason="NodeUnresponsive", message=message)]
        if now - (job.updated_at or now) >= timedelta(seconds=timing.node_lost_grace):
            # Lost through no fault of the job: retried without spending its backoff.
            return [Transition(Phase.PENDING, reason="NodeLost",
                               message=f"{message}; the attempt failed as NodeLost, requeued"),
                    Stop(force=True, why="node lost")]
        return []
    broken = next((o for o in seen if o.state == S.FAILED), None)
    if broken:  # cannot run at all (bad image, ...): stop the rest, no retry
        return [Terminate(Phase.FAILED, broken.reason or "ContainerCannotRun", broken.message or broken.status)]
    if job.job_type == JobType.INTERACTIVE and seen and len(ended) == len(seen):
        return _restart_in_place(job, seen, now)
    if seen and len(ended) == len(seen):
        if failed:
            return [RetryOrFail(failed[0].exit_code, exit_message(failed[0], len(seen)))]
        return [Transition(Phase.SUCCEEDED, reason="Completed", fields={"exit_code": 0},
                           message="All replicas exited with code 0" if len(seen) > 1 else "Exited with code 0")]
    if failed and job.job_type == JobType.TRAINING:  # one replica failed, others run: the attempt failed
        return [Terminate(Phase.FAILED, "Error", exit_message(failed[0], len(seen)) + "; stopping the other replicas")]
    if job.admitted_at and now >= job.admitted_at + timedelta(seconds=job.active_deadline_seconds):
        return [Terminate(Phase.TIMED_OUT, "DeadlineExceeded", f"Ran past its deadline of "
                                                              f"{job.active_deadline_seconds} s")]
    if states == {S.RUNNING} and job.phase in (Phase.PREPARING, Phase.UNKNOWN):
        return [Transition(Phase.RUNNING, message=f"{len(seen)} replica(s) running"
                           + (f" on {job.node}" if job.node else ""))]
    stuck_for = now - (job.attempt_started_at or now)
    if job.phase == Phase.PREPARING and stuck_for > timedelta(seconds=timing.preparing_timeout):
        return [_requeue(job, int(stuck_for.total_seconds()), now, timing)]
    # Same phase, finer status from the backend (ErrImagePull, Init:1/2, CrashLoopBackOff, ...).
    shown = next((o for o in seen if o.status), None)
    if shown and shown.status != job.status:
        return [Transition(job.phase, status=shown.status, reason=shown.reason, message=shown.message)]
    return []


def _terminating(job: JobView, seen: list[ReplicaObservation], now: datetime, timing: Timing) -> list[Action]:
    if all(o.state in ENDED and not o.present for o in seen):
        codes = [o.exit_code for o in seen if o.exit_code is not None]
        return [FinishTermination(next((c for c in codes if c != 0), codes[0] if codes else None))]
    if not job.stop_sent:
        return [Stop(force=False, why="graceful")]
    if job.stop_sent == "forced":
        return []
    if any(o.state == S.LOST for o in seen):
        return [Stop(force=True, why="node lost")]
    since = job.terminating_since or now
    if now - since > timedelta(seconds=timing.stuck_after):
        return [Stop(force=True, why=f"still there {int((now - since).total_seconds())} s after the stop")]
    return []


def _restart_in_place(job: JobView, seen: list[ReplicaObservation], now: datetime) -> list[Action]:
    """Interactive jobs never end by themselves: their replicas restart, with a growing delay (CrashLoopBackOff)."""
    if job.status == "CrashLoopBackOff" and job.retry_at and job.retry_at > now:
        return []  # waiting out the delay
    if job.status == "CrashLoopBackOff" and job.retry_at:
        return [Transition(Phase.RUNNING, reason="Restarted", fields={"retry_at": None},
                           message=f"Restarted in place (restart #{job.restarts})"),
                Relaunch()]
    restarts = job.restarts + 1
    delay = restart_delay(restarts)
    worst = next((o for o in seen if o.exit_code), seen[0])
    return [CountRestart(),
            Transition(Phase.RUNNING, status="CrashLoopBackOff", reason="CrashLoopBackOff",
                       fields={"exit_code": worst.exit_code, "retry_at": now + timedelta(seconds=delay)},
                       message=f"{exit_message(worst, len(seen))}; restart #{restarts} in {delay} s")]


def _requeue(job: JobView, stuck_seconds: int, now: datetime, timing: Timing) -> Terminate:
    """An attempt still preparing after the timeout: delete it and queue the job again, with a growing delay."""
    if job.requeues >= timing.requeue_limit:
        return Terminate(Phase.FAILED, "RequeueLimitExceeded",
                         f"Still preparing after {stuck_seconds} s, after {job.requeues} requeue(s): giving up")
    delay = requeue_delay(job.requeues)
    return Terminate(Phase.PENDING, "Requeued",
                     f"Still preparing after {stuck_seconds} s: requeued ({job.requeues + 1}/{timing.requeue_limit}), "
                     f"eligible again in {delay} s", retry_at=now + timedelta(seconds=delay))


def exit_message(o: ReplicaObservation, replicas: int) -> str:
    who = f"Replica {o.rank}" if replicas > 1 else "The command"
    return f"{who} exited with code {o.exit_code}" + (f" ({o.status})" if o.status else "")
