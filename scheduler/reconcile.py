"""What the observations of an attempt's replicas mean for its job: a pure function, table-tested like ``decide``.

``reconcile(job, replicas, now, timing)`` takes what the database says of a job holding resources (``JobView``),
what the backend says of each replica of its current attempt (``ReplicaObservation``) and the time, and returns the
actions that bring the job in line: transitions for the ``jobs`` services, and stops, launches and relaunches for the
backend. No ORM, no I/O, no clock; ``scheduler.sync`` reads the inputs and applies the actions.

The rules, in order (DESIGN.md §2–3):
- an attempt admitted but never launched is launched;
- an attempt gets its "Started" event when a replica is first seen running (or already ended), with the time the
  first one started: never at the launch, so an attempt that never ran says so by having none;
- an attempt whose launch was claimed ``start_timeout`` seconds ago while nothing of it exists or is known (every
  replica starting, none present, no status: the launcher died before starting it) is requeued at once as a new
  attempt (counted against the requeue limit, then FAILED), never left starting;
- TERMINATING: done (→ its target) once no replica is left; until then the replicas are stopped with the job's grace
  period, once (again by a new leader, which does not know what the old one sent: forced at once when the stop is
  already ``stuck_after`` old); force-stopped only when a replica's node is lost or they are still there
  ``stuck_after`` seconds after the stop (never merely because a grace period elapsed on our side);
- a replica the cluster disrupted through no fault of the job (``disruption``: preempted by the cluster's scheduler,
  evicted for node pressure, refused at admission by a GPU plugin, ...) requeues the attempt without spending the
  backoff, the cause in the message; past ``max_disruptions`` such requeues (NodeLost included) the job FAILS;
- a lost replica the backend knows left nothing behind (``gone``) requeues the attempt at once: counted against the
  requeue limit when it never ran, else as NodeLost without spending the backoff; any other lost replica makes the
  job UNKNOWN, and after ``node_lost_grace`` (the backend cannot tell: a node it cannot reach) the attempt fails as
  NodeLost, its replicas are force-stopped and, once they are gone, the job is requeued without spending its
  backoff;
- a replica that cannot run at all fails the job (no retry);
- interactive jobs restart in place (CrashLoopBackOff, growing delay) when all replicas ended;
- one attempt, one fate (``attempt_fate``): an attempt succeeded only when every replica exited 0; it failed as
  soon as one replica exited non-zero, with the exit code of the first one that did (the earliest to end, lowest
  rank on a tie). A failed training attempt is retried (BACKOFF) while the backoff limit allows, whatever the
  timing: replicas still running are stopped first and the retry decided once they are gone;
- past the active deadline: TIMED_OUT; all replicas running: RUNNING; still preparing past the timeout: requeued
  whole (growing delay) or, past the requeue limit, FAILED; otherwise the status of the slowest replica
  (``attempt_status``: Pending until every replica is placed, Init:done/total over all replicas, ...).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from jobs.choices import JobType, Phase
from jobs.rules import requeue_delay, restart_delay

from .values import ReplicaObservation, ReplicaState

S = ReplicaState


@dataclass(frozen=True)
class Timing:
    preparing_timeout: float = 180
    node_lost_grace: float = 300
    requeue_limit: int = 5
    stuck_after: float = 600  # seconds after a graceful stop before replicas still there are force-stopped
    start_timeout: float = 60  # seconds after a launch was claimed by which something of the attempt must exist
    max_disruptions: int = 10  # requeues a job may have for disruptions (NodeLost included) before it fails


@dataclass(frozen=True)
class JobView:
    """What reconcile needs of a job holding resources and of its current attempt."""

    phase: str
    status: str = ""
    message: str = ""
    reason: str = ""
    job_type: str = JobType.TRAINING
    terminating_since: datetime | None = None
    admitted_at: datetime | None = None
    active_deadline_seconds: int = 86400
    retry_at: datetime | None = None
    updated_at: datetime | None = None  # for UNKNOWN: since when
    attempt_started_at: datetime | None = None
    launched: bool = True
    launched_at: datetime | None = None  # when the launch was claimed
    started_recorded: bool = True  # the attempt's "Started" event is written
    node: str = ""
    restarts: int = 0  # in-place restarts of the attempt so far
    requeues: int = 0  # attempts of the job requeued so far
    stop_sent: str = ""  # "", "graceful" or "forced": what the scheduler already asked of the backend
    attempt_number: int = 1
    termination_target: str = ""  # TERMINATING: the phase it ends in (BACKOFF: retry or fail once stopped)
    exit_code: int | None = None  # TERMINATING a failed attempt: the first failing replica's code
    failed_rank: int | None = None  # ... and its rank
    disruptions: int = 0  # attempts of the job ended by a disruption (outcome Disrupted or NodeLost) so far


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
class RecordStarted:
    """Write the attempt's "Started" event: a replica was seen running (or already ended) for the first time.
    ``at``: when the first of them started, where the backend knows."""

    at: datetime | None = None


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
    """Start stopping the attempt; the job ends in ``target`` once its replicas are gone (BACKOFF: retried while
    its backoff limit allows, else FAILED). ``failed_rank``/``exit_code``: the replica that failed the attempt."""

    target: str
    reason: str
    message: str
    retry_at: datetime | None = None
    exit_code: int | None = None
    failed_rank: int | None = None


@dataclass(frozen=True)
class RetryOrFail:
    """The attempt failed by its own exit: back off and retry while the backoff limit allows, else FAILED."""

    exit_code: int | None
    message: str
    failed_rank: int | None = None
    reason: str = "Error"  # or OOMKilled: the failing replica was over its memory


@dataclass(frozen=True)
class FinishTermination:
    exit_code: int | None
    abandoned: str = ""  # replicas still there long after a forced stop: given up on, said in a Warning event


Action = (Launch | Stop | Relaunch | RecordStarted | CountRestart | Transition | Terminate | RetryOrFail
          | FinishTermination)

ENDED = frozenset({S.EXITED, S.LOST})
STOPPING_OTHERS = "; stopping the other replicas"


@dataclass(frozen=True)
class Fate:
    """What the replicas of an attempt say about it: ``succeeded``, ``failed`` (by ``rank``'s exit) or neither."""

    succeeded: bool = False
    failed: bool = False
    rank: int | None = None
    exit_code: int | None = None
    message: str = ""
    reason: str = ""  # of a failure: "Error", or "OOMKilled" when the first failed replica was over its memory


def attempt_fate(seen: list[ReplicaObservation]) -> Fate:
    """One attempt, one fate: succeeded only when every replica exited 0; failed from the moment one exited
    non-zero, by the first one that did (earliest end, then lowest rank), whatever the others do afterwards."""
    failed = [o for o in seen if o.state == S.EXITED and o.exit_code != 0]
    if failed:
        first = min(failed, key=lambda o: (o.finished_at is None, o.finished_at or datetime.min, o.rank))
        return Fate(failed=True, rank=first.rank, exit_code=first.exit_code, message=exit_message(first, len(seen)),
                    reason="OOMKilled" if first.status == "OOMKilled" else "Error")
    if seen and all(o.state == S.EXITED for o in seen):
        return Fate(succeeded=True, exit_code=0)
    return Fate()


def reconcile(job: JobView, seen: list[ReplicaObservation], now: datetime, timing: Timing) -> list[Action]:
    if not job.launched and job.phase != Phase.TERMINATING:  # cancelled before its launch: nothing to start
        return [Launch()]
    if job.phase == Phase.TERMINATING:
        return _terminating(job, seen, now, timing)
    ran = [o for o in seen if o.state in (S.RUNNING, S.EXITED)]
    if not job.started_recorded and ran:
        at = min((o.started_at for o in ran if o.started_at), default=None)
        return [RecordStarted(at), *reconcile(replace(job, started_recorded=True), seen, now, timing)]
    if job.phase == Phase.PREPARING and (never := _never_started(job, seen, now, timing)) is not None:
        return [never]

    states = {o.state for o in seen}
    ended = [o for o in seen if o.state in ENDED]

    disrupted = [o for o in seen if o.disruption]
    if disrupted:
        return _disrupted(job, disrupted, len(seen), timing)
    lost = [o for o in seen if o.state == S.LOST]
    if lost:
        message = "; ".join(o.message for o in lost)
        if all(o.gone and not o.present for o in lost):  # known to hold nothing: no grace to wait out
            return _gone(job, message, timing)
        if job.phase != Phase.UNKNOWN:
            return [Transition(Phase.UNKNOWN, reason="NodeUnresponsive", message=message)]
        if now - (job.updated_at or now) >= timedelta(seconds=timing.node_lost_grace):
            if job.disruptions >= timing.max_disruptions:
                return [_disruption_limit(job, f"{message}; the attempt failed as NodeLost", timing),
                        Stop(force=True, why="node lost")]
            # Lost through no fault of the job: retried without spending its backoff, once what is left of the
            # attempt is gone (its GPUs are not handed to anyone while its processes or pods may still be there).
            return [Terminate(Phase.PENDING, "NodeLost",
                              f"{message}; the attempt failed as NodeLost: force-stopping what is left of it, "
                              "then requeued"),
                    Stop(force=True, why="node lost")]
        return []
    broken = next((o for o in seen if o.state == S.FAILED), None)
    if broken:  # cannot run at all (bad image, ...): stop the rest, no retry
        return [Terminate(Phase.FAILED, broken.reason or "ContainerCannotRun", broken.message or broken.status,
                          failed_rank=broken.rank)]
    if job.job_type == JobType.INTERACTIVE and seen and len(ended) == len(seen):
        return _restart_in_place(job, seen, now)
    fate = attempt_fate(seen)
    if fate.succeeded:
        return [Transition(Phase.SUCCEEDED, reason="Completed", fields={"exit_code": 0},
                           message="All replicas exited with code 0" if len(seen) > 1 else "Exited with code 0")]
    if fate.failed and job.job_type == JobType.TRAINING:
        message = f"Attempt {job.attempt_number} failed: {fate.message}"
        if len(ended) == len(seen):
            return [RetryOrFail(fate.exit_code, message, failed_rank=fate.rank, reason=fate.reason)]
        # The others may run on for ever (a collective waiting on the dead rank): stop them, then retry or fail.
        return [Terminate(Phase.BACKOFF, fate.reason, message + STOPPING_OTHERS, exit_code=fate.exit_code,
                          failed_rank=fate.rank)]
    if job.admitted_at and now >= job.admitted_at + timedelta(seconds=job.active_deadline_seconds):
        return [Terminate(Phase.TIMED_OUT, "DeadlineExceeded", f"Ran past its deadline of "
                                                              f"{job.active_deadline_seconds} s")]
    if states == {S.RUNNING} and job.phase in (Phase.PREPARING, Phase.UNKNOWN):
        return [Transition(Phase.RUNNING, message=f"{len(seen)} replica(s) running"
                           + (f" on {job.node}" if job.node else ""))]
    stuck_for = now - (job.attempt_started_at or now)
    if job.phase == Phase.PREPARING and stuck_for > timedelta(seconds=timing.preparing_timeout):
        return [_requeue(job, int(stuck_for.total_seconds()), now, timing)]
    # Same phase, the finer status of the slowest replica (ErrImagePull, Pending, Init:1/4, CrashLoopBackOff, ...).
    shown = attempt_status(seen)
    if shown and shown.status != job.status:
        return [Transition(job.phase, status=shown.status, reason=shown.reason, message=shown.message)]
    return []


INIT = re.compile(r"^Init:(\d+)/(\d+)$")
# How far a replica that is not running yet has got, slowest first; any other status (ErrImagePull,
# CrashLoopBackOff, Init:Error, Terminating, ...) explains a wait and is shown before these.
PROGRESS = ("Pending", "Init", "PodInitializing", "ContainerCreating")


def attempt_status(seen: list[ReplicaObservation]) -> ReplicaObservation | None:
    """The status the job shows while its replicas differ: the slowest replica's, as Run:ai shows a distributed job.

    A problem any replica has comes first; then Pending (not placed) until every replica is; then Init:done/total
    counted over every replica's init containers; then ContainerCreating until every replica runs.
    """
    shown = [o for o in seen if o.status]
    if not shown:
        return None
    problem = next((o for o in shown if _progress(o.status) is None), None)
    if problem is not None:
        return problem
    slowest = min(shown, key=lambda o: _progress(o.status))
    inits = [INIT.match(o.status) for o in shown]
    if PROGRESS[_progress(slowest.status)] == "Init":
        per_replica = max(int(m.group(2)) for m in inits if m)
        done = sum(int(m.group(1)) if m else per_replica for m in inits) + per_replica * (len(seen) - len(shown))
        return ReplicaObservation(slowest.rank, slowest.state, status=f"Init:{done}/{per_replica * len(seen)}",
                                  message=slowest.message)
    return slowest


def _progress(status: str) -> int | None:
    name = "Init" if INIT.match(status) else status
    return PROGRESS.index(name) if name in PROGRESS else None


def _never_started(job: JobView, seen: list[ReplicaObservation], now: datetime, timing: Timing) -> Terminate | None:
    """A launch claimed long ago of which nothing exists and nothing is known (every replica "starting" with no
    status, none present): its launcher died before starting it. Requeued at once (a new attempt, no delay), counted
    against the requeue limit. (A replica the backend reports lost goes the NodeLost way; one with a status, e.g. a
    pod waiting for a node, the preparing timeout's.)"""
    if job.launched_at is None or not seen or any(o.present or o.state != S.STARTING or o.status for o in seen):
        return None
    waited = int((now - job.launched_at).total_seconds())
    if waited <= timing.start_timeout:
        return None
    what = f"Launched {waited} s ago, nothing of it started (its launcher was interrupted)"
    if job.requeues >= timing.requeue_limit:
        return Terminate(Phase.FAILED, "RequeueLimitExceeded", f"{what}, after {job.requeues} requeue(s): giving up")
    return Terminate(Phase.PENDING, "Requeued",
                     f"{what}: requeued ({job.requeues + 1}/{timing.requeue_limit}) as a new attempt")


DISRUPTED = "Disrupted"  # the outcome of an attempt the cluster ended through no fault of the job


def _disrupted(job: JobView, disrupted: list[ReplicaObservation], replicas: int, timing: Timing) -> list[Action]:
    """The cluster ended (or is ending) replicas through no fault of the job, as the Job controller's
    podFailurePolicy counts a DisruptionTarget: requeued at once as a new attempt, its backoff not spent, until the
    job has been disrupted ``max_disruptions`` times. What is left is stopped (at once where a node is lost)."""
    cause = "; ".join(dict.fromkeys((f"rank {o.rank} " if replicas > 1 else "") + o.disruption for o in disrupted))
    stop = [Stop(force=True, why="node lost")] if any(o.state == S.LOST for o in disrupted) else []
    if job.disruptions >= timing.max_disruptions:
        return [_disruption_limit(job, capitalized(cause), timing), *stop]
    return [Terminate(Phase.PENDING, DISRUPTED,
                      f"{capitalized(cause)}: requeued ({job.disruptions + 1}/{timing.max_disruptions}) as a new "
                      "attempt, its backoff not spent"), *stop]


def _disruption_limit(job: JobView, what: str, timing: Timing) -> Terminate:
    return Terminate(Phase.FAILED, "DisruptionLimitExceeded",
                     f"{what}; disrupted by the cluster {job.disruptions + 1} time(s) (limit "
                     f"{timing.max_disruptions}): giving up")


def _gone(job: JobView, message: str, timing: Timing) -> list[Action]:
    """Replicas lost that the backend knows left nothing behind: the attempt is requeued at once. One that never ran
    (its supervisor died before starting it) counts against the requeue limit, as a launch that never started does;
    one that ran is lost through no fault of the job: NodeLost, the backoff not spent. What may still be there of
    the other replicas is force-stopped first."""
    if job.phase == Phase.PREPARING and not job.started_recorded:
        if job.requeues >= timing.requeue_limit:
            return [Terminate(Phase.FAILED, "RequeueLimitExceeded",
                              f"{message}; nothing of it is left, after {job.requeues} requeue(s): giving up")]
        return [Terminate(Phase.PENDING, "Requeued", f"{message}; nothing of it is left: requeued "
                                                     f"({job.requeues + 1}/{timing.requeue_limit}) as a new attempt"),
                Stop(force=True, why="replica gone")]
    return [Terminate(Phase.PENDING, "NodeLost", f"{message}; nothing of it is left: the attempt failed as NodeLost, "
                                                 "requeued at once"),
            Stop(force=True, why="replica gone")]


def _terminating(job: JobView, seen: list[ReplicaObservation], now: datetime, timing: Timing) -> list[Action]:
    if all(o.state in ENDED and not o.present for o in seen):
        if not job.stop_sent and any(o.gone for o in seen):
            # Nothing of it is left, or nothing was ever started: stopped all the same, so that a start still on
            # its way (a deposed leader's launch) runs nothing. Ended by the next round.
            return [Stop(force=True, why="nothing left")]
        return [_finish(job, seen)]
    lost = any(o.state == S.LOST for o in seen)
    since = job.terminating_since or now
    waited = int((now - since).total_seconds())
    if not job.stop_sent:  # none sent by this scheduler: the first, or a new leader taking over a stop
        if not lost and waited > timing.stuck_after:
            return [Stop(force=True, why=f"still there {waited} s after the stop")]
        return [Stop(force=lost, why="node lost" if lost else "graceful")]
    if job.stop_sent == "forced":
        if waited > 2 * timing.stuck_after:  # bounded: a TERMINATING job always reaches its end
            left = ", ".join(str(o.rank) for o in seen if o.present or o.state not in ENDED)
            return [_finish(job, seen, abandoned=(
                f"replica(s) {left} still there {waited} s after being killed: given up on, resources released"))]
        return []
    if lost:
        return [Stop(force=True, why="node lost")]
    if waited > timing.stuck_after:
        return [Stop(force=True, why=f"still there {waited} s after the stop")]
    return []


def _finish(job: JobView, seen: list[ReplicaObservation], abandoned: str = "") -> Action:
    """The end of a termination: a failed attempt (target BACKOFF) is retried or failed by its first failure's
    code; any other ends in its target with the first non-zero code seen."""
    if job.termination_target == Phase.BACKOFF:
        message = job.message.removesuffix(STOPPING_OTHERS) + (f"; {abandoned}" if abandoned else "")
        return RetryOrFail(job.exit_code, message, failed_rank=job.failed_rank,
                           reason="OOMKilled" if job.reason == "OOMKilled" else "Error")
    codes = [o.exit_code for o in seen if o.exit_code is not None]
    return FinishTermination(next((c for c in codes if c != 0), codes[0] if codes else None), abandoned=abandoned)


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
                       message=f"{capitalized(exit_message(worst, len(seen)))}; restart #{restarts} in {delay} s")]


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
    """"rank 1 exited with code 137 (killed by SIGKILL)", "the command exited with code 3 (Error)"."""
    who = f"rank {o.rank}" if replicas > 1 else "the command"
    notes = [o.status] if o.status else []
    if o.exit_code is not None and 128 < o.exit_code < 128 + signal.NSIG:
        try:
            notes.append(f"killed by {signal.Signals(o.exit_code - 128).name}")
        except ValueError:
            pass
    return f"{who} exited with code {o.exit_code}" + (f" ({', '.join(notes)})" if notes else "")


def capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]
