"""One scheduling pass: snapshot → decide (pure, scheduler.core) → apply under row locks → launch after commit.

Two passes never over-commit: apply holds the row locks of every group while it reads usage and admits, so a
second pass waits and then sees the first one's admissions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from jobs import services
from jobs.choices import QUEUED_PHASES, RESOURCE_PHASES, Phase
from jobs.durations import DurationHistory, job_duration_history
from jobs.models import Attempt, Group, GroupQuota, Job
from jobs.models import Node as NodeRow
from jobs.state_machine import InvalidTransition

from . import metrics
from .actuator import get_actuator
from .backends import get_backend
from .backends.base import Backend
from .core import (
    HOLDING_REASONS,
    GroupState,
    Node,
    Outcome,
    QueuedJob,
    QuotaLimits,
    Reason,
    ReplicaPlacement,
    RunningJob,
    Verdict,
    behind_message,
    decide,
)
from .estimate import HeldJob, estimate

log = logging.getLogger(__name__)


@dataclass
class PassResult:
    admitted: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    waiting: int = 0
    inadmissible: int = 0


@dataclass
class Snapshot:
    groups: dict[int, GroupState]
    queued: list[QueuedJob]
    running: list[RunningJob]
    nodes: list[Node]
    shown: dict[int, QueueInfo]  # what each queued job shows now, to write only what changed
    holding: list[HeldJob] = field(default_factory=list)  # every job holding resources, for the estimates
    kinds: dict[int, JobKind] = field(default_factory=dict)  # queued and holding jobs: what their history is of
    estimates: dict[int, tuple[datetime | None, str]] = field(default_factory=dict)  # shown now, per queued job
    # Per group: how many of its first jobs were asked for, and the ids of those read (fewer: all of its queue).
    prefix: dict[int, tuple[int, set[int]]] = field(default_factory=dict)


QueueInfo = tuple[str, str, str, int | None]  # phase, reason, message, queue position
JobKind = tuple[int, int, str, int, int]  # user, group, name, instance type, active deadline (seconds)


HEAD_ROWS = 1  # each group's first jobs in queue order that a pass reads at first (× 4 while not enough)
QUEUED_FIELDS = (
    "id", "name", "group_id", "user_id", "priority", "queued_at", "replicas", "gpu", "cpu_millicores",
    "memory_bytes", "preemptible", "phase", "reason", "message", "retry_at", "instance_type_id",
    "active_deadline_seconds", "estimated_start", "estimate_basis",
)


def snapshot(backend: Backend, *, head_rows: Mapping[int, int] | None = None) -> Snapshot:
    """Read what the decision and the estimates need, in a handful of queries whatever the length of the queues.

    Of the queued jobs only these: each group's first ``head_rows`` jobs in queue order (``HEAD_ROWS`` by default),
    and every queued job not already waiting behind its group's head (new, inadmissible, or pending for another
    reason: the heads, the jobs user quotas skip past, the requeued, the nominated). The jobs behind a head
    (PENDING, BlockedByQueueHead) are not read: they keep waiting behind it."""
    groups = {gid: GroupState(id=gid, name=name, queue_stopped=stopped)
              for gid, name, stopped in Group.objects.values_list("id", "name", "queue_stopped")}
    for gid, resource, quota, limit, user_quota in GroupQuota.objects.values_list(
            "group_id", "resource", "quota", "limit", "user_quota"):
        groups[gid].quotas[resource] = QuotaLimits(quota, limit, user_quota)
    stopped = [gid for gid, g in groups.items() if g.queue_stopped]
    if head_rows is None:
        head_rows = {gid: HEAD_ROWS for gid in groups if gid not in stopped}

    unsettled = (
        Job.objects.filter(phase__in=QUEUED_PHASES).exclude(phase=Phase.PENDING, reason=Reason.BLOCKED)
        .exclude(phase=Phase.INADMISSIBLE, reason=Reason.QUEUE_STOPPED, group_id__in=stopped)
        .values_list(*QUEUED_FIELDS)
    )
    rows = {r[0]: r for r in unsettled}
    if stopped:  # a stopped queue: every job in it becomes inadmissible
        rows.update((r[0], r) for r in Job.objects.filter(phase=Phase.PENDING, group_id__in=stopped)
                    .values_list(*QUEUED_FIELDS))
    prefix: dict[int, set[int]] = {gid: set() for gid in head_rows}
    for r in queue_heads(head_rows):
        rows[r[0]] = r
        prefix[r[2]].add(r[0])

    queued, shown, kinds, estimates = [], {}, {}, {}
    for (id_, name, group_id, user_id, priority, queued_at, replicas, gpu, cpu, memory, preemptible, phase, reason,
         message, retry_at, itype, deadline, estimated_start, estimate_basis) in rows.values():
        queued.append(QueuedJob(
            id=id_, name=name, group_id=group_id, user_id=user_id, priority=priority, queued_at=queued_at,
            replicas=replicas, preemptible=preemptible, not_before=retry_at,
            request={"gpu": gpu, "cpu": cpu, "memory": memory},
            nominated=phase == Phase.PENDING and reason == Reason.PREEMPTING,
        ))
        shown[id_] = (phase, reason, message, None)
        kinds[id_] = (user_id, group_id, name, itype, deadline)
        estimates[id_] = (estimated_start, estimate_basis)
    # Every job holding resources: its usage (group and user), and for the estimates where it runs and since when;
    # decide() gets only those it can use: preemptible jobs (victims; over-quota ones are preemptible) and
    # terminating ones (resources soon free).
    running, holding, placed = [], [], []
    for h in _holding.read(backend.name):
        g = groups[h.held.group_id]
        per_user = g.user_usage.setdefault(h.held.user_id, {})
        for r, amount in h.total.items():
            g.usage[r] = g.usage.get(r, 0) + amount
            per_user[r] = per_user.get(r, 0) + amount
        if h.placed is not None:
            placed.append(h.placed)
        holding.append(h.held)
        kinds[h.held.id] = h.kind
        if h.running is not None:
            running.append(h.running)
    return Snapshot(groups, queued, running, nodes_with_free(backend.name, placed), shown, holding, kinds, estimates,
                    {gid: (head_rows[gid], ids) for gid, ids in prefix.items()})


HOLDING_FIELDS = (
    "id", "name", "group_id", "user_id", "priority", "preemptible", "replicas", "admitted_at", "gpu",
    "cpu_millicores", "memory_bytes", "over_quota", "phase", "current_attempt__placement", "instance_type_id",
    "active_deadline_seconds", "current_attempt__backend", "current_attempt__gpu",
)


@dataclass(frozen=True)
class _Holding:
    """A job holding resources as a pass uses it, made from its row and its current attempt's."""

    total: dict[str, int]  # its usage: request × replicas
    placed: tuple[dict[str, int], tuple[ReplicaPlacement, ...]] | None  # on the pass's backend: what, where
    held: HeldJob
    kind: JobKind
    running: RunningJob | None  # what decide() may use: preemptible or terminating


def _holding_of(row: tuple, backend_name: str) -> _Holding:
    (id_, name, group_id, user_id, priority, preemptible, replicas, admitted_at, gpu, cpu, memory, over_quota, phase,
     placement_json, itype, deadline, attempt_backend, attempt_gpu) = row
    request = {"gpu": gpu, "cpu": cpu, "memory": memory}
    placement = tuple(ReplicaPlacement(p.get("node", ""), tuple(p.get("gpu_ids", [])))
                      for p in (placement_json or {}).values())
    placed = None
    if attempt_backend == backend_name:
        placed = ({"gpu": attempt_gpu or 0, "cpu": cpu, "memory": memory}, placement)
    terminating = phase == Phase.TERMINATING
    admitted_at = admitted_at or timezone.now()
    running = None
    if preemptible or terminating:
        running = RunningJob(id=id_, name=name, group_id=group_id, priority=priority, preemptible=preemptible,
                             replicas=replicas, admitted_at=admitted_at, request=request, over_quota=over_quota,
                             terminating=terminating, placement=placement)
    return _Holding(
        total={r: amount * replicas for r, amount in request.items()}, placed=placed,
        held=HeldJob(id=id_, group_id=group_id, user_id=user_id, replicas=replicas, request=request,
                     admitted_at=admitted_at, placement=placement, terminating=terminating),
        kind=(user_id, group_id, name, itype, deadline), running=running,
    )


class _HoldingCache:
    """The jobs holding resources, kept between passes: on PostgreSQL a pass reads each job's row version (its
    ``xmin`` and ``ctid`` and its current attempt's: any UPDATE, even a second one in the same transaction, gives a
    row a new ``ctid``) and reads whole, and parses, only the rows that are new or changed. A steady pass over
    thousands of running jobs then costs one narrow query instead of thousands of rows parsed."""

    def __init__(self) -> None:
        self.database: tuple[str, str, str] | None = None
        self.entries: dict[int, tuple[tuple, _Holding]] = {}  # job id → (version, parsed)
        self.lock = threading.Lock()  # passes of several threads (tests, the embedded server's) take turns

    def read(self, backend_name: str) -> list[_Holding]:
        with self.lock:
            return self._read(backend_name)

    def _read(self, backend_name: str) -> list[_Holding]:
        phases = sorted(RESOURCE_PHASES)
        if connection.vendor != "postgresql":
            return [_holding_of(row, backend_name)
                    for row in Job.objects.filter(phase__in=phases).values_list(*HOLDING_FIELDS)]
        database = (connection.alias, str(connection.settings_dict.get("NAME")), backend_name)
        if database != self.database:
            self.database, self.entries = database, {}
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT j.id, j.xmin::text, j.ctid::text, a.xmin::text, a.ctid::text "
                f"FROM {Job._meta.db_table} j LEFT JOIN {Attempt._meta.db_table} a ON a.id = j.current_attempt_id "
                f"WHERE j.phase IN ({', '.join(['%s'] * len(phases))})", phases)
            versions = {row[0]: row[1:] for row in cursor.fetchall()}
        stale = [i for i, version in versions.items() if self.entries.get(i, (None,))[0] != version]
        if stale:
            # Read after the versions: a row changed in between is read as it is now under its older version,
            # and simply read again by the next pass.
            for row in Job.objects.filter(pk__in=stale).values_list(*HOLDING_FIELDS):
                self.entries[row[0]] = (versions[row[0]], _holding_of(row, backend_name))
        for gone in self.entries.keys() - versions.keys():
            del self.entries[gone]
        return [self.entries[i][1] for i in versions if i in self.entries]


_holding = _HoldingCache()


def queue_heads(limits: Mapping[int, int]) -> list[tuple]:
    """The first ``limits[group]`` queued jobs of each group in queue order, as ``QUEUED_FIELDS`` tuples: one
    query (on PostgreSQL a top-N index scan per group, whatever the length of its queue)."""
    if not limits:
        return []
    by_limit: dict[int, list[int]] = {}
    for gid, n in limits.items():
        by_limit.setdefault(n, []).append(gid)
    found: list[tuple] = []
    for n, gids in by_limit.items():
        if connection.vendor == "postgresql":
            table = Job._meta.db_table
            columns = ", ".join(f"j.{Job._meta.get_field(f).column}" for f in QUEUED_FIELDS)
            phases = sorted(QUEUED_PHASES)
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT h.* FROM unnest(%s::bigint[]) AS g(id) CROSS JOIN LATERAL (SELECT {columns} "
                    f"FROM {table} j WHERE j.group_id = g.id AND j.phase IN ({', '.join(['%s'] * len(phases))}) "
                    "ORDER BY j.priority DESC, j.queued_at, j.id LIMIT %s) h", [gids, *phases, n])
                found.extend(cursor.fetchall())
        else:
            found.extend(
                Job.objects.filter(phase__in=QUEUED_PHASES, group_id__in=gids)
                .annotate(rank=Window(RowNumber(), partition_by=F("group_id"),
                                      order_by=[F("priority").desc(), F("queued_at").asc(), F("id").asc()]))
                .filter(rank__lte=n).values_list(*QUEUED_FIELDS)
            )
    return found


def decide_heads(backend: Backend, now: datetime) -> tuple[Snapshot, list[Outcome]]:
    """Snapshot and decide; while what was read of a group's queue does not reach the job that holds it (its
    first jobs were all admitted or skipped), read more of that group and decide again."""
    limits: dict[int, int] | None = None
    while True:
        snap = snapshot(backend, head_rows=limits)
        outcomes = decide(snap.groups, snap.queued, snap.nodes, snap.running, now=now)
        short = short_groups(snap, outcomes)
        if not short:
            return snap, outcomes
        limits = {gid: n * 4 if gid in short else n for gid, (n, _) in snap.prefix.items()}


def short_groups(snap: Snapshot, outcomes: list[Outcome]) -> set[int]:
    """The groups of which more must be read: all of their first jobs asked for were there, and no job up to the
    last of those holds the queue (so a job not read may come before the head)."""
    jobs = {j.id: j for j in snap.queued}
    holder: dict[int, QueuedJob] = {}
    for o in outcomes:
        job = jobs.get(o.job_id)
        if job and o.verdict == Verdict.WAIT and o.reason in HOLDING_REASONS and job.group_id not in holder:
            holder[job.group_id] = job
    short = set()
    for gid, (asked, ids) in snap.prefix.items():
        if len(ids) < asked:
            continue  # its whole queue was read
        last = max(jobs[i].order_key for i in ids)
        if gid not in holder or holder[gid].order_key > last:
            short.add(gid)
    return short


def queue_heads_changed(snap: Snapshot, outcomes: list[Outcome]) -> tuple[dict[int, str], list[int]]:
    """What the jobs behind each group's head show now ({group: message}), and the groups whose head or its
    reason changed since the last pass (every job behind it shows the new one)."""
    jobs = {j.id: j for j in snap.queued}
    heads: dict[int, str] = {}
    for o in outcomes:
        job = jobs.get(o.job_id)
        if job and o.verdict == Verdict.WAIT and o.reason in HOLDING_REASONS and job.group_id not in heads:
            heads[job.group_id] = behind_message(job.id, job.name, o.reason)
    before: dict[int, str | None] = {}
    for job_id, (phase, reason, _, _) in snap.shown.items():
        if phase == Phase.PENDING and reason in HOLDING_REASONS:
            job = jobs[job_id]
            before[job.group_id] = None if job.group_id in before else behind_message(job.id, job.name, reason)
    return heads, [gid for gid, message in heads.items() if before.get(gid) != message]


def nodes_with_free(backend: str, placed: list[tuple[dict[str, int], tuple[ReplicaPlacement, ...]]]) -> list[Node]:
    """The nodes the scheduler last recorded for ``backend``, minus what the attempts holding resources have placed
    on them (``placed``: each one's request per replica and placement, read with the jobs holding resources), as
    ``jobs.selectors.nodes_with_usage`` counts them. Database only: nothing here waits on the cluster while the
    group rows are locked; one query."""
    nodes = {name: Node(name, dict(allocatable), dict(allocatable), None)
             for name, allocatable in NodeRow.objects.filter(backend=backend).values_list("name", "allocatable")}
    if not nodes:
        return []
    busy: dict[str, set[int]] = {}
    for request, placement in placed:
        for p in placement:
            node = nodes.get(p.node)
            if node is None:
                continue
            for r in node.free:
                node.free[r] -= request.get(r, 0)
            busy.setdefault(p.node, set()).update(p.gpu_ids)
    for n in nodes.values():
        if "gpu" in n.allocatable:
            taken = busy.get(n.name, set())
            n.free_gpu_ids = [i for i in range(n.allocatable["gpu"]) if i not in taken]
    return list(nodes.values())


def schedule_pass(*, backend: Backend | None = None, now: datetime | None = None) -> PassResult:
    backend = backend or get_backend()
    result = PassResult()
    clock = now or timezone.now()
    refresh_nodes(backend)  # before the locks: the backend answers from memory
    history = duration_history(clock)  # before the locks too: at most one query a minute
    with transaction.atomic():
        # The scheduling lock: every group row, in a stable order.
        list(Group.objects.select_for_update().order_by("id").values_list("id", flat=True))
        snap, outcomes = decide_heads(backend, clock)
        waiting: list[int] = []
        requests = {j.id: j for j in snap.queued}
        refreshed: dict[int, str] = {}
        behind: list[int] = []  # read jobs that now wait behind their group's head
        victims = Job.objects.in_bulk([o.job_id for o in outcomes if o.verdict == Verdict.PREEMPT])
        for outcome in outcomes:
            try:
                if outcome.verdict == Verdict.PREEMPT:
                    if outcome.job_id in victims:
                        services.job_preempt(job=victims[outcome.job_id], by_job_id=outcome.by,
                                             message=outcome.message, now=now)
                        result.preempted.append(outcome.job_id)
                    continue
                phase, reason, message, _ = snap.shown[outcome.job_id]
                if outcome.verdict == Verdict.ADMIT:
                    _admit(outcome, phase, requests[outcome.job_id], backend, now)
                    result.admitted.append(outcome.job_id)
                    continue
                target = Phase.PENDING if outcome.verdict == Verdict.WAIT else Phase.INADMISSIBLE
                if outcome.reason == Reason.BLOCKED and phase == Phase.PENDING:
                    # Not an event of its own: written with every other job behind the same head, below.
                    if (reason, message) != (outcome.reason, outcome.message):
                        behind.append(outcome.job_id)
                elif (phase, reason) != (target, outcome.reason):
                    services.job_transition(
                        job=Job(pk=outcome.job_id), phase=target, reason=str(outcome.reason),
                        status="Inadmissible" if target == Phase.INADMISSIBLE else None,
                        message=outcome.message, now=now,
                    )
                elif message != outcome.message:
                    refreshed[outcome.job_id] = outcome.message
            except InvalidTransition:  # cancelled meanwhile: its row lock showed the new phase
                continue
            if outcome.verdict == Verdict.WAIT:
                result.waiting += 1
                waiting.append(outcome.job_id)
            else:
                result.inadmissible += 1
        services.job_queue_info_update(refreshed)
        heads, moved = queue_heads_changed(snap, outcomes)
        services.job_queue_behind_update(behind=heads, jobs=behind, groups=moved)
        admitted = list(result.admitted)
        transaction.on_commit(lambda: launch_jobs(admitted, backend=backend))
        waited = [requests[i].queued_at for i in admitted]
        transaction.on_commit(lambda: [metrics.observe_admission(queued_at) for queued_at in waited])
    # After the scheduling lock is released: the simulation is CPU work no other pass need wait for, and the write
    # touches only jobs still pending.
    snap, outcomes, waiting = estimated_part(snap, outcomes, waiting)
    if estimate_due(snap, outcomes, history, clock):
        services.job_estimate_update(estimate_changes(snap, outcomes, history, clock, waiting))
    return result


def estimated_part(snap: Snapshot, outcomes: list[Outcome], waiting: list[int]
                   ) -> tuple[Snapshot, list[Outcome], list[int]]:
    """What the estimates are made for: the jobs a steady pass reads (each group's first jobs, and those not behind
    a head) and the jobs new to the queue, not every pending job a pass that found many reasons changed had to
    read. The others keep the estimate they have (made when they entered the queue or were last read)."""
    keep = {i for _, ids in snap.prefix.values() for i in ids}
    keep.update(o.job_id for o in outcomes if o.reason != Reason.BLOCKED)
    keep.update(i for i, (phase, _, _, _) in snap.shown.items() if phase != Phase.PENDING)
    if len(keep) >= len(snap.queued):
        return snap, outcomes, waiting
    part = replace(snap, queued=[j for j in snap.queued if j.id in keep])
    return part, [o for o in outcomes if o.job_id in keep], [i for i in waiting if i in keep]


# --- estimated start times -------------------------------------------------------------------------------------

HISTORY_SPAN = timedelta(days=30)  # how far back similar jobs' run times are looked for
HISTORY_TTL = timedelta(seconds=60)  # how long the scheduler reuses them
ESTIMATE_SLACK = timedelta(seconds=60)  # an estimate that moved less is not written again
_history: tuple[datetime, DurationHistory] | None = None


def duration_history(now: datetime) -> DurationHistory:
    """How long similar recent jobs ran: read at most once a minute of the pass clock (one query)."""
    global _history
    if _history is None or not timedelta(0) <= now - _history[0] < HISTORY_TTL:
        _history = (now, job_duration_history(since=now - HISTORY_SPAN))
    return _history[1]


def duration_history_clear() -> None:
    global _history, _estimated
    _history = None
    _estimated = None


_estimated: tuple[int, datetime] | None = None  # what the last estimate was made of, and its pass clock


def estimate_due(snap: Snapshot, outcomes: list[Outcome], history: DurationHistory, now: datetime) -> bool:
    """Whether the waiting jobs' estimates may have moved since the last pass made them: something they are made
    of changed (the decision, the jobs holding resources, the nodes, the quotas, the history, the estimates shown),
    or ``ESTIMATE_SLACK`` has passed (until then an estimate moves less than what is written). A steady pass over a
    long queue skips the simulation."""
    global _estimated
    made_of = hash((
        tuple((o.job_id, o.verdict, o.reason) for o in outcomes),
        tuple((h.id, h.terminating) for h in snap.holding),
        tuple((n.name, tuple(sorted(n.free.items()))) for n in snap.nodes),
        tuple((gid, g.queue_stopped, tuple(sorted(g.quotas.items()))) for gid, g in sorted(snap.groups.items())),
        tuple(sorted(snap.estimates.items())),
        id(history),
    ))
    if _estimated and _estimated[0] == made_of and timedelta(0) <= now - _estimated[1] < ESTIMATE_SLACK:
        return False
    _estimated = (made_of, now)
    return True


def estimate_changes(snap: Snapshot, outcomes: list[Outcome], history: DurationHistory, now: datetime,
                     waiting: list[int]) -> dict[int, tuple[datetime | None, str]]:
    """The estimated start of each job left waiting by this pass, where it differs from what the job shows (by
    more than a minute, or in its basis): {job id: (start or None, basis or "")}."""
    durations = {
        job_id: history.expected(user_id=user, group_id=group, name=name, instance_type_id=itype, deadline=deadline)
        for job_id, (user, group, name, itype, deadline) in snap.kinds.items()
    }
    try:
        estimates = estimate(snap.groups, snap.queued, snap.nodes, snap.holding, durations, now, outcomes=outcomes)
    except Exception:  # an estimate is a courtesy: it must never hold back admissions
        log.exception("could not estimate the start of the waiting jobs; they keep their last estimates")
        return {}
    changes = {}
    for job_id in waiting:
        new = estimates.get(job_id)
        start, basis = (new.start, new.basis) if new else (None, "")
        old_start, old_basis = snap.estimates[job_id]
        moved = (start is None) != (old_start is None) or (
            start is not None and old_start is not None and abs(start - old_start) > ESTIMATE_SLACK)
        if moved or basis != old_basis:
            changes[job_id] = (start, basis)
    return changes


def refresh_nodes(backend: Backend) -> None:
    """Record the backend's nodes in the database (the Node table), for admission and the pages. The backend
    answers from what it already knows (no cluster call here); None: it does not know yet, keep the last rows."""
    nodes = backend.nodes()
    if nodes is None:
        return
    services.nodes_record(backend=backend.name, nodes={n.name: dict(n.allocatable) for n in nodes})


def _admit(outcome: Outcome, phase: str, queued: QueuedJob, backend: Backend, now: datetime | None) -> None:
    job = Job.objects.get(pk=outcome.job_id)
    if phase != Phase.PENDING:  # SUBMITTED or INADMISSIBLE: into the queue first, so the trail says so
        services.job_transition(job=job, phase=Phase.PENDING, reason="Queued", now=now)
    placement = [{"node": p.node, "gpu_ids": list(p.gpu_ids)} for p in outcome.placement]
    services.job_admit(job=job, backend=backend.name, placement=placement or [{"node": ""}] * queued.replicas,
                       over_quota=outcome.over_quota, nominated=queued.nominated, now=now)


def launch_jobs(job_ids: list[int], *, backend: Backend) -> None:
    """Hand the admitted jobs to the actuator (its pool in the scheduler loop): admission never waits on them."""
    actuator = get_actuator(backend)
    for job_id in job_ids:
        actuator.launch(job_id)
