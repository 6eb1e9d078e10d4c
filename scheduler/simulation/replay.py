"""Replay a workload on the simulated backend in virtual time: the scheduler's own work, none of the waiting.

The workload and its format: ``scheduler.simulation.workload``; the figures printed of a result:
``scheduler.simulation.report``.

How it runs (in memory, no database): the virtual clock jumps from event to event (the next arrival, the next
change the simulated backend reports: a launch, an end, a stop). At each moment the scheduler's pure core does the
work, exactly as the scheduler process would with these observations:
- ``scheduler.core.decide`` admits, holds and preempts; it is asked about the head of every group's queue (the
  first few waiting jobs of each, more while a group admits all it was asked about) rather than every waiting job,
  as admission by queue heads does: a job behind its group's holder cannot be admitted in that pass anyway;
- admitted jobs are launched on ``scheduler.backends.sim.SimBackend``; what it reports of each changed attempt goes
  through ``scheduler.reconcile.reconcile``, and every phase change its actions ask for is checked by
  ``jobs.state_machine.check_transition``;
- a preempted training job terminates, its replicas are stopped, and it comes back to its queue keeping its place
  (as ``jobs.services.job_preempt`` does).
Wall time is therefore the scheduler's own work; the virtual makespan is what the workload would take. A moment
whose passes keep preempting (``MAX_ROUNDS`` of them) is left as it is and counted in ``livelocks``.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from jobs.choices import RESOURCE_PHASES, JobType, Phase
from jobs.rules import QuotaLimits
from jobs.state_machine import check_transition

from ..backends.sim import SimBackend
from ..core import GroupState, Outcome, QueuedJob, Reason, ReplicaPlacement, RunningJob, Verdict, decide
from ..reconcile import (
    CountRestart,
    FinishTermination,
    JobView,
    Launch,
    Relaunch,
    RetryOrFail,
    Stop,
    Terminate,
    Timing,
    Transition,
    reconcile,
)
from ..values import LaunchReplica, LaunchSpec
from .workload import GroupSpec, WorkJob, Workload

T0 = datetime(2026, 1, 1, tzinfo=UTC)  # virtual time zero: the workload's "submit": 0
WINDOW = 2  # waiting jobs of each group asked about first; doubled while a group admits all it was asked about
HOLDING = frozenset({Reason.GROUP_QUOTA, Reason.CAPACITY, Reason.PREEMPTING, Reason.BLOCKED})
# Sync/decide rounds at one moment: a bound against passes that keep preempting each other's jobs (counted as
# ``livelocks``; the clock then moves on to the next event).
MAX_ROUNDS = 10
DEFAULT_NODES, DEFAULT_GPUS_PER_NODE = 1, 8


@dataclass
class AttemptRecord:
    """One attempt of a job as it happened in virtual time (seconds), for the figures and the checks."""

    job: int
    group: str
    gpus: int  # in all (replicas × per replica)
    start: float
    end: float | None = None
    placement: tuple[ReplicaPlacement, ...] = ()
    over_quota: bool = False
    preemptible: bool = False
    order: tuple[int, int | None] = (0, None)  # when it started and ended among all starts and ends (a trace's order)


@dataclass
class _Job:
    id: int
    spec: WorkJob
    queued: QueuedJob
    phase: str = Phase.SUBMITTED
    status: str = "Submitted"
    reason: str = ""
    message: str = ""
    attempt: int = 0
    placement: tuple[ReplicaPlacement, ...] = ()
    admitted_at: datetime | None = None
    updated_at: datetime | None = None
    terminating_since: datetime | None = None
    termination_target: str = ""
    stop_sent: str = ""
    first_start: float | None = None
    end: float | None = None
    record: AttemptRecord | None = None


@dataclass
class ReplayResult:
    jobs: int
    capacity: int  # GPUs
    wall_seconds: float
    makespan: float  # virtual seconds, from the first submit to the last end
    useful_gpu_seconds: float  # of the jobs that completed
    held_gpu_seconds: float  # every attempt, preempted ones included
    waits: dict[str, list[float]]  # group → seconds from submit to first start, per started job
    class_waits: dict[str, list[float]]  # job name → the same
    attempts: list[AttemptRecord]
    succeeded: int = 0
    inadmissible: int = 0
    preemptions: int = 0
    steps: int = 0  # moments the clock stopped at
    decisions: int = 0  # decide() calls
    livelocks: int = 0  # moments left after MAX_ROUNDS passes that kept preempting
    phases: dict[str, int] = field(default_factory=dict)  # final phase → jobs
    cpu_seconds: float = 0.0  # of this process during the replay: the wall time less what a busy machine took

    @property
    def ideal_makespan(self) -> float:
        return self.useful_gpu_seconds / self.capacity if self.capacity else 0.0

    @property
    def usage(self) -> float:
        """Busy with useful work: GPU-seconds of the completed jobs / (capacity × makespan), 0..1."""
        return self.useful_gpu_seconds / (self.capacity * self.makespan) if self.capacity and self.makespan else 0.0

    @property
    def held_usage(self) -> float:
        return self.held_gpu_seconds / (self.capacity * self.makespan) if self.capacity and self.makespan else 0.0

    @property
    def jobs_per_second(self) -> float:
        return self.succeeded / self.wall_seconds if self.wall_seconds else 0.0


class VirtualClock:
    def __init__(self, now: datetime = T0):
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _seconds(t: datetime) -> float:
    return (t - T0).total_seconds()


class Replay:
    def __init__(self, workload: Workload, *, nodes: int | None = None, gpus_per_node: int | None = None,
                 start_delay: float = 0.0, stop_delay: float = 0.0, cancels: Mapping[int, float] | None = None):
        """``cancels``: job (its number among the workload's jobs, from 1) → the virtual second its user cancels
        it (as ``jobs.services.job_cancel`` does)."""
        self.workload = workload
        self.cancels = sorted((T0 + timedelta(seconds=t), job_id) for job_id, t in (cancels or {}).items())
        per_node = gpus_per_node or workload.gpus_per_node or DEFAULT_GPUS_PER_NODE
        if workload.node_list and not nodes and not gpus_per_node:
            layout: list[tuple[str, int]] | int = list(workload.node_list)
        else:
            layout = nodes or workload.nodes or (len(workload.node_list) if workload.node_list else DEFAULT_NODES)
        self.clock = VirtualClock()
        self.durations: dict[int, float] = {}
        self.backend = SimBackend(layout, per_node, clock=self.clock, durations=self.durations,
                                  start_delay=start_delay, stop_delay=stop_delay)
        self.nodes = self.backend.nodes()
        self.by_node = {n.name: n for n in self.nodes}
        self.capacity = sum(n.allocatable["gpu"] for n in self.nodes)
        self.layout = (f"{len(self.nodes)} node(s) × {per_node} GPUs" if isinstance(layout, int)
                       else f"{len(self.nodes)} node(s)")
        self.timing = Timing(stuck_after=self.backend.stuck_after())

        names = sorted({j.group for j in workload.jobs} | set(workload.groups))
        self.group_ids = {name: i + 1 for i, name in enumerate(names)}
        self.groups: dict[int, GroupState] = {}
        for name, gid in self.group_ids.items():
            spec = workload.groups.get(name, GroupSpec())
            self.groups[gid] = GroupState(gid, name, {"gpu": QuotaLimits(spec.quota, spec.limit, spec.user_quota)})
        users = sorted({j.user for j in workload.jobs})
        self.user_ids = {name: i + 1 for i, name in enumerate(users)}

        self.jobs: dict[int, _Job] = {}
        self.queues: dict[int, list[tuple[tuple, int]]] = {gid: [] for gid in self.groups}  # (order key, job id)
        self.running: dict[int, RunningJob] = {}  # what decide() may preempt or sees terminating
        self.touched: set[tuple[int, int]] = set()  # attempts to reconcile besides what the backend reports
        self.attempts: list[AttemptRecord] = []
        self.dirty = False  # something happened a decision could depend on since the last one
        self.sequence = 0
        # Every phase change in order: (virtual second, job, from, to, reason).
        self.transitions: list[tuple[float, int, str, str, str]] = []
        self.preemptions = self.decisions = self.steps = self.inadmissible = self.livelocks = 0

    # --- arrivals and queues ---------------------------------------------------------------------------------

    def submit(self, job_id: int, spec: WorkJob) -> None:
        now = self.clock()
        queued = QueuedJob(id=job_id, name=spec.name, group_id=self.group_ids[spec.group],
                           user_id=self.user_ids[spec.user], priority=spec.priority, queued_at=now,
                           replicas=spec.replicas, request={"gpu": spec.gpus}, preemptible=spec.preemptible)
        job = self.jobs[job_id] = _Job(job_id, spec, queued)
        self.durations[job_id] = spec.duration
        self._phase(job, Phase.PENDING, reason="Queued")
        self._enqueue(job)

    def _enqueue(self, job: _Job, *, news: bool = True) -> None:
        """Into its group's queue; ``news``: something the next decision has not seen yet (an arrival, a requeue)."""
        bisect.insort(self.queues[job.queued.group_id], (job.queued.order_key, job.id))
        self.dirty |= news

    def _dequeue(self, job: _Job) -> None:
        queue = self.queues[job.queued.group_id]
        i = bisect.bisect_left(queue, (job.queued.order_key, job.id))
        del queue[i]

    # --- bookkeeping ------------------------------------------------------------------------------------------

    def _phase(self, job: _Job, phase: str, *, reason: str = "", message: str = "", status: str | None = None
               ) -> None:
        check_transition(job.phase, phase)  # the state machine every status write goes through
        if phase != job.phase:
            self.transitions.append((_seconds(self.clock()), job.id, job.phase, phase, reason))
        job.phase, job.reason, job.message = phase, reason, message
        job.status = status if status is not None else str(Phase(phase).label)
        job.updated_at = self.clock()

    def _charge(self, job: _Job, sign: int) -> None:
        q = job.queued
        group = self.groups[q.group_id]
        total = q.request["gpu"] * q.replicas
        group.usage["gpu"] = group.usage.get("gpu", 0) + sign * total
        user = group.user_usage.setdefault(q.user_id, {})
        user["gpu"] = user.get("gpu", 0) + sign * total
        for p in job.placement:
            node = self.by_node[p.node]
            node.free["gpu"] += -sign * q.request["gpu"]
            if sign > 0:
                taken = set(p.gpu_ids)
                node.free_gpu_ids = [g for g in node.free_gpu_ids if g not in taken]
            else:
                node.free_gpu_ids = sorted(node.free_gpu_ids + list(p.gpu_ids))

    def _release(self, job: _Job) -> None:
        """The attempt ended and nothing of it is left: its GPUs and quota go back."""
        now = _seconds(self.clock())
        self._charge(job, -1)
        self.running.pop(job.id, None)
        if job.record is not None:
            job.record.end = now
            job.record.order = (job.record.order[0], self._next())
            job.record = None
        job.placement = ()
        self.dirty = True

    def _next(self) -> int:
        self.sequence += 1
        return self.sequence

    # --- admission --------------------------------------------------------------------------------------------

    def schedule(self) -> bool:
        """One scheduling pass at the current moment; True when it admitted or preempted anything."""
        if not self.dirty:
            return False
        self.dirty = False
        acted = False
        windows = {gid: WINDOW for gid, queue in self.queues.items() if queue}
        while windows:
            asked = {gid: [self.jobs[i].queued for _, i in self.queues[gid][:size]] for gid, size in windows.items()}
            jobs = [j for window in asked.values() for j in window]
            # Asked again about the groups that may admit more: the other groups' nominated jobs (first in their
            # queues) come along, as what they reserve must stay theirs.
            jobs += [self.jobs[i].queued for gid, queue in self.queues.items() if gid not in windows
                     for _, i in queue[:WINDOW] if self.jobs[i].queued.nominated]
            outcomes = decide(self.groups, jobs, self.nodes, list(self.running.values()), now=self.clock())
            self.decisions += 1
            held: set[int] = set()
            for outcome in outcomes:
                acted |= self._apply(outcome, held)
            # A group that admitted (or passed over) all it was asked about may admit more behind them.
            windows = {gid: size * 2 for gid, size in windows.items()
                       if gid not in held and len(self.queues[gid]) > size - self._gone(asked[gid])}
            windows = {gid: size for gid, size in windows.items() if self.queues[gid]}
        return acted

    def _gone(self, asked: list[QueuedJob]) -> int:
        return sum(1 for j in asked if self.jobs[j.id].phase != Phase.PENDING)

    def _apply(self, outcome: Outcome, held: set[int]) -> bool:
        job = self.jobs[outcome.job_id]
        if outcome.verdict == Verdict.ADMIT:
            self._admit(job, outcome)
            return True
        if outcome.verdict == Verdict.PREEMPT:
            self._preempt(job, outcome.message)
            return True
        if outcome.verdict == Verdict.INADMISSIBLE:  # nothing in a replay changes quotas or nodes: it never runs
            self._dequeue(job)
            self._phase(job, Phase.INADMISSIBLE, reason=outcome.reason, message=outcome.message,
                        status="Inadmissible")
            self.inadmissible += 1
            return False
        if outcome.reason in HOLDING:
            held.add(job.queued.group_id)
        nominated = outcome.reason == Reason.PREEMPTING
        if nominated != job.queued.nominated:  # its place in the queue follows its nomination
            self._dequeue(job)
            job.queued = replace(job.queued, nominated=nominated)
            self._enqueue(job, news=False)
        job.reason, job.message = outcome.reason, outcome.message
        return False

    def _admit(self, job: _Job, outcome: Outcome) -> None:
        now = self.clock()
        self._dequeue(job)
        self._phase(job, Phase.PREPARING, reason="Admitted", message=outcome.message)
        job.attempt += 1
        job.placement = outcome.placement
        job.admitted_at = now
        job.terminating_since, job.termination_target, job.stop_sent = None, "", ""
        self._charge(job, +1)
        q = job.queued
        if q.preemptible:
            self.running[job.id] = RunningJob(
                id=job.id, name=q.name, group_id=q.group_id, priority=q.priority, preemptible=True,
                replicas=q.replicas, request=q.request, admitted_at=now, over_quota=outcome.over_quota,
                placement=outcome.placement)
        start = _seconds(now)
        if job.first_start is None:
            job.first_start = start
        job.record = AttemptRecord(job.id, job.spec.group, q.request["gpu"] * q.replicas, start,
                                   placement=outcome.placement, over_quota=outcome.over_quota,
                                   preemptible=q.preemptible, order=(self._next(), None))
        self.attempts.append(job.record)
        self._launch(job)

    def _launch(self, job: _Job) -> None:
        """What the actuator does after the admission commits."""
        self.backend.launch(LaunchSpec(
            job_id=job.id, attempt_id=job.id * 1000 + job.attempt, attempt_number=job.attempt, command="",
            image="", job_name=job.spec.name, group=job.spec.group, user=job.spec.user,
            request={"gpu": job.spec.gpus},
            replicas=[LaunchReplica(rank, p.node, p.gpu_ids, {}) for rank, p in enumerate(job.placement)],
        ))
        self.touched.add((job.id, job.attempt))  # the launch is a change the next sync sees

    def cancel(self, job_id: int) -> None:
        """jobs.services.job_cancel by the job's user: a queued job ends at once, one holding resources terminates
        (its replicas are stopped) and ends CANCELLED; one being preempted ends CANCELLED instead of requeued."""
        job = self.jobs.get(job_id)
        if job is None or job.phase not in RESOURCE_PHASES | {Phase.SUBMITTED, Phase.PENDING, Phase.INADMISSIBLE}:
            return
        reason, message = "CancelledByUser", f"Cancelled by {job.spec.user}"
        if job.phase == Phase.TERMINATING:
            if job.termination_target in (Phase.PENDING, Phase.PREEMPTED, Phase.BACKOFF):
                job.reason, job.message, job.termination_target = reason, message, Phase.CANCELLED
            return
        if job.phase in RESOURCE_PHASES:
            self._terminate(job, Terminate(Phase.CANCELLED, reason, message))
            return
        if job.phase == Phase.PENDING:
            self._dequeue(job)
        self._phase(job, Phase.CANCELLED, reason=reason, message=message, status="Cancelled")
        self.dirty = True

    def _preempt(self, job: _Job, message: str) -> None:
        """jobs.services.job_preempt: a training job terminates and comes back PENDING, keeping its place."""
        self._terminate(job, Terminate(Phase.PENDING, "Preempted", message))
        self.preemptions += 1

    def _terminate(self, job: _Job, action: Terminate) -> None:
        self._phase(job, Phase.TERMINATING, reason=action.reason, message=action.message, status="Terminating")
        job.termination_target = action.target
        job.terminating_since = self.clock()
        if job.id in self.running:
            self.running[job.id] = replace(self.running[job.id], terminating=True)
        else:  # a job that could not be preempted holds resources decide() must see as soon free
            q = job.queued
            self.running[job.id] = RunningJob(
                id=job.id, name=q.name, group_id=q.group_id, priority=q.priority, preemptible=q.preemptible,
                replicas=q.replicas, request=q.request, admitted_at=job.admitted_at or self.clock(),
                terminating=True, placement=job.placement)
        self.touched.add((job.id, job.attempt))

    # --- sync: observations → reconcile → transitions --------------------------------------------------------

    def sync(self, changed: set[tuple[int, int]]) -> None:
        now = self.clock()
        for job_id, number in sorted(changed):
            job = self.jobs[job_id]
            if job.attempt != number or job.phase not in RESOURCE_PHASES:
                continue  # an attempt already over
            view = JobView(
                phase=job.phase, status=job.status, message=job.message, job_type=JobType.TRAINING,
                terminating_since=job.terminating_since, admitted_at=job.admitted_at,
                active_deadline_seconds=10**9, updated_at=job.updated_at, attempt_started_at=job.admitted_at,
                launched=True, node=",".join(sorted({p.node for p in job.placement})), stop_sent=job.stop_sent,
                attempt_number=job.attempt, termination_target=job.termination_target,
            )
            seen = self.backend.observe(job_id=job.id, attempt_number=job.attempt, replicas=job.spec.replicas)
            for action in reconcile(view, seen, now, self.timing):
                self._act(job, action)

    def _act(self, job: _Job, action) -> None:
        match action:
            case Launch() | Relaunch():
                self._launch(job)
            case Stop(force=force):
                self.backend.stop(job_id=job.id, attempt_number=job.attempt, replicas=job.spec.replicas,
                                  force=force)
                job.stop_sent = "forced" if force else "graceful"
            case Transition():
                self._phase(job, action.phase, reason=action.reason, message=action.message, status=action.status)
                if action.phase not in RESOURCE_PHASES:
                    self._release(job)
                    if action.phase == Phase.SUCCEEDED:
                        job.end = _seconds(self.clock())
            case Terminate():
                self._terminate(job, action)
            case RetryOrFail():  # simulated replicas exit 0 unless stopped: not expected, but final if it happens
                self._phase(job, Phase.FAILED, reason=action.reason, message=action.message)
                self._release(job)
            case FinishTermination():
                target = job.termination_target or Phase.CANCELLED
                self._phase(job, target, reason=job.reason, message=job.message)
                self._release(job)
                if target == Phase.PENDING:  # requeued: a new attempt later, in its old place
                    job.queued = replace(job.queued, nominated=False)
                    self._enqueue(job)
            case CountRestart():
                pass

    # --- the clock --------------------------------------------------------------------------------------------

    def run(self) -> ReplayResult:
        started, cpu = time.perf_counter(), time.process_time()
        order = sorted(range(len(self.workload.jobs)), key=lambda i: (self.workload.jobs[i].submit, i))
        arrivals = [(T0 + timedelta(seconds=self.workload.jobs[i].submit), i) for i in order]
        nxt = cancelled = 0
        while True:
            candidates = [t for t in (arrivals[nxt][0] if nxt < len(arrivals) else None,
                                      self.cancels[cancelled][0] if cancelled < len(self.cancels) else None,
                                      self.backend.next_change()) if t is not None]
            if not candidates:
                break
            self.clock.now = min(candidates)
            self.steps += 1
            while nxt < len(arrivals) and arrivals[nxt][0] <= self.clock.now:
                i = arrivals[nxt][1]
                self.submit(i + 1, self.workload.jobs[i])
                nxt += 1
            while cancelled < len(self.cancels) and self.cancels[cancelled][0] <= self.clock.now:
                self.cancel(self.cancels[cancelled][1])
                cancelled += 1
            for _ in range(MAX_ROUNDS):  # settle this moment: sync what changed, decide, until quiet
                changed = self.backend.due(self.clock.now) | self.touched
                self.touched = set()
                self.sync(changed)
                acted = self.schedule()
                upcoming = self.backend.next_change()
                if not acted and not self.touched and (upcoming is None or upcoming > self.clock.now):
                    break
            else:
                self.livelocks += 1
                self.sync(self.backend.due(self.clock.now) | self.touched)  # what this moment's last pass asked
                self.touched = set()
        result = self._result(time.perf_counter() - started)
        result.cpu_seconds = time.process_time() - cpu
        return result

    def _result(self, wall: float) -> ReplayResult:
        waits: dict[str, list[float]] = {name: [] for name in self.group_ids}
        class_waits: dict[str, list[float]] = {}
        phases: dict[str, int] = {}
        useful = 0.0
        for job in self.jobs.values():
            phases[job.phase] = phases.get(job.phase, 0) + 1
            if job.first_start is not None:
                wait = job.first_start - job.spec.submit
                waits[job.spec.group].append(wait)
                class_waits.setdefault(job.spec.name, []).append(wait)
            if job.phase == Phase.SUCCEEDED:
                useful += job.spec.gpu_seconds
        ends = [a.end for a in self.attempts if a.end is not None]
        first = min((j.submit for j in self.workload.jobs), default=0.0)
        makespan = max(ends) - first if ends else 0.0
        held = sum(a.gpus * (a.end - a.start) for a in self.attempts if a.end is not None)
        return ReplayResult(
            jobs=len(self.jobs), capacity=self.capacity, wall_seconds=wall, makespan=makespan,
            useful_gpu_seconds=useful, held_gpu_seconds=held, waits=waits, class_waits=class_waits,
            attempts=self.attempts, succeeded=phases.get(Phase.SUCCEEDED, 0), inadmissible=self.inadmissible,
            preemptions=self.preemptions, livelocks=self.livelocks, steps=self.steps, decisions=self.decisions,
            phases=phases,
        )

