"""Replay a workload on the simulated backend in virtual time: the scheduler's own work, none of the waiting.

A workload is JSON Lines, one job a line (``parse_workload``); an optional first line, the header, describes the
groups (GPU quota, borrowing limit, per-user quota), the cluster and defaults for every job::

    {"groups": {"team-a": {"quota": 20, "limit": 120}}, "cluster": {"nodes": 30, "gpus_per_node": 20},
     "defaults": {"preemptible": true}}
    {"submit": 0.0, "group": "team-a", "user": "ana", "gpus": 1, "duration": 0.2, "priority": 0, "name": "small"}

``submit`` and ``duration`` are seconds (submit: from the start of the workload). Optional per job: ``user``
("user"), ``priority`` (50, normal), ``replicas`` (1, ``gpus`` each), ``preemptible`` (false), ``name``.
A group the header does not list has no quota. Only GPUs are simulated (no CPU or memory requests).

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
import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from jobs.choices import RESOURCE_PHASES, JobType, Phase
from jobs.rules import QuotaLimits
from jobs.state_machine import check_transition

from .backends.sim import SimBackend
from .core import GroupState, Outcome, QueuedJob, Reason, ReplicaPlacement, RunningJob, Verdict, decide
from .reconcile import (
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
from .values import LaunchReplica, LaunchSpec

T0 = datetime(2026, 1, 1, tzinfo=UTC)  # virtual time zero: the workload's "submit": 0
WINDOW = 2  # waiting jobs of each group asked about first; doubled while a group admits all it was asked about
HOLDING = frozenset({Reason.GROUP_QUOTA, Reason.CAPACITY, Reason.PREEMPTING, Reason.BLOCKED})
# Sync/decide rounds at one moment: a bound against passes that keep preempting each other's jobs (counted as
# ``livelocks``; the clock then moves on to the next event).
MAX_ROUNDS = 10
DEFAULT_NODES, DEFAULT_GPUS_PER_NODE = 1, 8
JOB_KEYS = {"submit", "group", "user", "gpus", "duration", "priority", "replicas", "preemptible", "name"}
HEADER_KEYS = {"groups", "cluster", "defaults"}


class WorkloadError(ValueError):
    """A workload that cannot be replayed; the message names the line."""


# --- the workload ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupSpec:
    quota: int | None = None  # GPUs guaranteed; None: unlimited
    limit: int | None = None  # GPUs preemptible jobs may borrow up to; None: the quota
    user_quota: int | None = None


@dataclass(frozen=True)
class WorkJob:
    submit: float
    group: str
    user: str
    gpus: int  # per replica
    duration: float
    priority: int = 50
    replicas: int = 1
    preemptible: bool = False
    name: str = "job"

    @property
    def gpu_seconds(self) -> float:
        return self.gpus * self.replicas * self.duration


@dataclass
class Workload:
    jobs: list[WorkJob]
    groups: dict[str, GroupSpec] = field(default_factory=dict)
    nodes: int | None = None
    gpus_per_node: int | None = None
    node_list: list[tuple[str, int]] | None = None  # (name, GPUs) of unlike nodes, in place of the two above


def _number(line: int, obj: Mapping, key: str, kind: type, *, minimum: float = 0, required: bool = True,
            default=None):
    if key not in obj:
        if required:
            raise WorkloadError(f"line {line}: missing '{key}'")
        return default
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or (
            kind is float and not math.isfinite(value)):
        raise WorkloadError(f"line {line}: '{key}' must be {'a number' if kind is float else 'an integer'}, "
                            f"got {json.dumps(value)}")
    if value < minimum:
        raise WorkloadError(f"line {line}: '{key}' must be at least {minimum:g}, got {value}")
    return kind(value)


def _optional_int(line: int, obj: Mapping, key: str) -> int | None:
    if obj.get(key) is None:
        return None
    return _number(line, obj, key, int)


def _header(line: int, obj: Mapping, workload: Workload) -> dict:
    unknown = set(obj) - HEADER_KEYS
    if unknown:
        raise WorkloadError(f"line {line}: unknown header key(s) {', '.join(sorted(unknown))}")
    groups = obj.get("groups", {})
    if not isinstance(groups, dict):
        raise WorkloadError(f"line {line}: 'groups' must be an object of group name → quotas")
    for name, spec in groups.items():
        if not isinstance(spec, dict):
            raise WorkloadError(f"line {line}: group '{name}' must be an object (quota, limit, user_quota)")
        quota, limit = _optional_int(line, spec, "quota"), _optional_int(line, spec, "limit")
        if quota is not None and limit is not None and limit < quota:
            raise WorkloadError(f"line {line}: group '{name}': the limit ({limit}) must be at least the quota "
                                f"({quota})")
        workload.groups[name] = GroupSpec(quota, limit, _optional_int(line, spec, "user_quota"))
    cluster = obj.get("cluster", {})
    if not isinstance(cluster, dict):
        raise WorkloadError(f"line {line}: 'cluster' must be an object (nodes, gpus_per_node)")
    workload.nodes = _number(line, cluster, "nodes", int, minimum=1, required=False)
    workload.gpus_per_node = _number(line, cluster, "gpus_per_node", int, minimum=1, required=False)
    defaults = obj.get("defaults", {})
    if not isinstance(defaults, dict) or set(defaults) - (JOB_KEYS - {"submit", "duration"}):
        raise WorkloadError(f"line {line}: 'defaults' must be an object of job fields")
    return defaults


def parse_workload(lines: Iterable[str]) -> Workload:
    """A workload from JSON Lines (see the module's doc). Blank lines are skipped; a bad line raises
    ``WorkloadError`` naming its number."""
    workload = Workload(jobs=[])
    defaults: dict = {}
    seen_job = False
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"line {number}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"line {number}: expected a JSON object")
        if set(obj) & HEADER_KEYS:
            if seen_job or workload.groups or workload.nodes:
                raise WorkloadError(f"line {number}: the header (groups, cluster, defaults) must be the first line")
            defaults = _header(number, obj, workload)
            continue
        seen_job = True
        obj = {**defaults, **obj}
        unknown = set(obj) - JOB_KEYS
        if unknown:
            raise WorkloadError(f"line {number}: unknown key(s) {', '.join(sorted(unknown))}")
        group = obj.get("group")
        if not isinstance(group, str) or not group:
            raise WorkloadError(f"line {number}: 'group' must be a non-empty string")
        preemptible = obj.get("preemptible", False)
        if not isinstance(preemptible, bool):
            raise WorkloadError(f"line {number}: 'preemptible' must be true or false")
        workload.jobs.append(WorkJob(
            submit=_number(number, obj, "submit", float),
            group=group,
            user=str(obj.get("user", "user")),
            gpus=_number(number, obj, "gpus", int),
            duration=_number(number, obj, "duration", float),
            priority=_number(number, obj, "priority", int, minimum=-32768, required=False, default=50),
            replicas=_number(number, obj, "replicas", int, minimum=1, required=False, default=1),
            preemptible=preemptible,
            name=str(obj.get("name", "job")),
        ))
    return workload


def load_workload(path: str | Path) -> Workload:
    try:
        with open(path, encoding="utf-8") as f:
            return parse_workload(f)
    except OSError as exc:
        raise WorkloadError(f"cannot read: {exc.strerror}") from None


def parse_quota_overrides(items: Iterable[str]) -> dict[str, int]:
    """["team-a=24", ...] → {"team-a": 24}."""
    result = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit():
            raise WorkloadError(f"--quota {item!r}: expected GROUP=GPUS, e.g. team-a=16")
        result[name] = int(value)
    return result


def with_quotas(workload: Workload, quotas: Mapping[str, int]) -> Workload:
    """The workload with these groups' GPU quotas changed (a borrowing limit below the new quota rises to it)."""
    groups = dict(workload.groups)
    for name, quota in quotas.items():
        old = groups.get(name, GroupSpec())
        limit = None if old.limit is None else max(old.limit, quota)
        groups[name] = replace(old, quota=quota, limit=limit)
    return replace(workload, groups=groups)


# --- the replay ------------------------------------------------------------------------------------------------


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
                 start_delay: float = 0.0, stop_delay: float = 0.0):
        self.workload = workload
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
        nxt = 0
        while True:
            candidates = [t for t in (arrivals[nxt][0] if nxt < len(arrivals) else None,
                                      self.backend.next_change()) if t is not None]
            if not candidates:
                break
            self.clock.now = min(candidates)
            self.steps += 1
            while nxt < len(arrivals) and arrivals[nxt][0] <= self.clock.now:
                i = arrivals[nxt][1]
                self.submit(i + 1, self.workload.jobs[i])
                nxt += 1
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


def unknown_groups(workload: Workload, quotas: Mapping[str, int]) -> list[str]:
    """Groups named in ``quotas`` that the workload does not know (a likely typo)."""
    known = {j.group for j in workload.jobs} | set(workload.groups)
    return sorted(set(quotas) - known)


# --- figures ---------------------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(math.ceil(p / 100 * len(ordered)) - 1, 0)]


def wait_summary(values: list[float]) -> tuple[float, float, float] | None:
    """(p50, p90, max) of waits, None without any."""
    if not values:
        return None
    return percentile(values, 50), percentile(values, 90), max(values)


def fmt_seconds(s: float) -> str:
    if s < 10:
        return f"{s:.2f} s"
    if s < 3600:
        return f"{s:.1f} s"
    return f"{s / 3600:.1f} h"


def report_lines(result: ReplayResult, *, layout: str) -> list[str]:
    lines = [
        f"jobs: {result.jobs:,} ({result.succeeded:,} completed, {result.inadmissible:,} inadmissible, "
        f"{result.preemptions:,} preemptions) on {layout} = {result.capacity:,} GPUs",
        f"wall time (the scheduler's own work): {result.wall_seconds:.2f} s (CPU {result.cpu_seconds:.2f} s), "
        f"{result.jobs_per_second:,.0f} jobs/s ({result.steps:,} moments, {result.decisions:,} decide() calls"
        + (f", {result.livelocks:,} moments cut short after {MAX_ROUNDS} passes that kept preempting"
           if result.livelocks else "") + ")",
        f"virtual makespan: {fmt_seconds(result.makespan)}",
        f"ideal makespan (GPU-seconds {result.useful_gpu_seconds:,.0f} / {result.capacity:,} GPUs): "
        f"{fmt_seconds(result.ideal_makespan)}",
        f"GPU usage: {100 * result.usage:.1f} % (useful GPU-seconds / capacity × makespan; held, preempted work "
        f"included: {100 * result.held_usage:.1f} %)",
        "waits per group (submit → first start): p50 / p90 / max",
    ]
    width = max((len(g) for g in result.waits), default=5)
    for group, values in sorted(result.waits.items()):
        summary = wait_summary(values)
        shown = " / ".join(fmt_seconds(v) for v in summary) if summary else "no job started"
        lines.append(f"  {group:<{width}}  {len(values):>6} jobs  {shown}")
    if len(result.class_waits) > 1:
        lines.append("waits per job name: p50 / p90 / max (mean)")
        width = max(len(n) for n in result.class_waits)
        for name, values in sorted(result.class_waits.items()):
            p50, p90, most = wait_summary(values)
            lines.append(f"  {name:<{width}}  {len(values):>6} jobs  {fmt_seconds(p50)} / {fmt_seconds(p90)} / "
                         f"{fmt_seconds(most)} ({fmt_seconds(sum(values) / len(values))})")
    return lines


# --- "what if": the recent history under other quotas ---------------------------------------------------------


@dataclass
class History:
    workload: Workload
    observed: dict[str, list[float]]  # group → the waits the jobs really had (submit → last admission), seconds
    since: datetime
    cluster: str  # where the nodes came from, in words


def workload_from_history(days: float, *, now: datetime | None = None) -> History:
    """The jobs queued in the last ``days`` that ran and ended, as a workload: submit offsets from the first one,
    group, user, GPUs and replicas, priority, preemptible, and how long the last attempt ran (started → finished);
    the groups' GPU quotas as they are now; the nodes the scheduler last recorded for the configured backend
    (none recorded: one node of JOBSITE_LOCAL_GPUS)."""
    from django.conf import settings
    from django.utils import timezone

    from jobs.choices import TERMINAL_PHASES
    from jobs.models import GroupQuota, Job
    from jobs.models import Node as NodeRow

    now = now or timezone.now()
    since = now - timedelta(days=days)
    rows = list(Job.objects.filter(queued_at__gte=since, phase__in=TERMINAL_PHASES, started_at__isnull=False,
                                   finished_at__isnull=False)
                .order_by("queued_at", "id")
                .values("name", "group__name", "user__username", "gpu", "replicas", "priority", "preemptible",
                        "queued_at", "admitted_at", "started_at", "finished_at"))
    first = rows[0]["queued_at"] if rows else now
    jobs, observed = [], {}
    for r in rows:
        jobs.append(WorkJob(
            submit=(r["queued_at"] - first).total_seconds(), group=r["group__name"], user=r["user__username"],
            gpus=r["gpu"], duration=max((r["finished_at"] - r["started_at"]).total_seconds(), 0.0),
            priority=r["priority"], replicas=r["replicas"], preemptible=r["preemptible"], name=r["name"],
        ))
        admitted = r["admitted_at"] or r["started_at"]
        observed.setdefault(r["group__name"], []).append(max((admitted - r["queued_at"]).total_seconds(), 0.0))
    groups = {q.group.name: GroupSpec(q.quota, q.limit, q.user_quota)
              for q in GroupQuota.objects.filter(resource="gpu").select_related("group")}
    recorded = [(n.name, int(n.allocatable.get("gpu", 0)))
                for n in NodeRow.objects.filter(backend=settings.JOBSITE_BACKEND).order_by("name")]
    recorded = [n for n in recorded if n[1] > 0]
    if recorded:
        cluster = f"the {len(recorded)} node(s) last recorded for the {settings.JOBSITE_BACKEND} backend"
    else:
        recorded = [("local", settings.JOBSITE_LOCAL_GPUS)]
        cluster = f"no node recorded: one node of {settings.JOBSITE_LOCAL_GPUS} GPUs (JOBSITE_LOCAL_GPUS)"
    workload = Workload(jobs=jobs, groups=groups, node_list=recorded)
    return History(workload, observed, since, cluster)


def compare_lines(history: History, actual: ReplayResult, changed: ReplayResult, quotas: Mapping[str, int]
                  ) -> list[str]:
    """Waits per group side by side: as they were, replayed under the actual quotas, replayed under the changed."""
    def cell(values: list[float]) -> str:
        summary = wait_summary(values)
        return " / ".join(fmt_seconds(v) for v in summary) if summary else "-"

    groups = sorted(set(actual.waits) | set(history.observed))
    width = max([len(g) for g in groups] + [5])
    change = ", ".join(f"{g}={q}" for g, q in sorted(quotas.items())) or "none"
    lines = [
        f"{len(history.workload.jobs):,} jobs queued since {history.since:%Y-%m-%d %H:%M} that ran and ended; "
        f"cluster: {history.cluster}",
        f"changed GPU quotas: {change}",
        f"makespan {fmt_seconds(actual.makespan)} → {fmt_seconds(changed.makespan)}, GPU usage "
        f"{100 * actual.usage:.1f} % → {100 * changed.usage:.1f} %, preemptions {actual.preemptions} → "
        f"{changed.preemptions}",
        "waits per group, p50 / p90 / max:",
        f"  {'group':<{width}}  {'jobs':>5}  {'as they were':<28}  {'replayed, actual quotas':<28}  "
        f"replayed, changed quotas",
    ]
    for g in groups:
        lines.append(f"  {g:<{width}}  {len(history.observed.get(g, [])):>5}  {cell(history.observed.get(g, [])):<28}"
                     f"  {cell(actual.waits.get(g, [])):<28}  {cell(changed.waits.get(g, []))}")
    return lines
