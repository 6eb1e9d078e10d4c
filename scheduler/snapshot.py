"""A pass's snapshot: what the decision and the estimates read of the database, in a handful of queries.

The queued jobs a pass asks about (each group's first jobs in queue order, and those not waiting behind a head),
the jobs holding resources (kept between passes, only new or changed rows read again), the groups with their quotas
and usage, and the recorded nodes less what is placed on them. Nothing here writes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection
from django.db.models import Count, F, Q, QuerySet, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from jobs.choices import QUEUED_PHASES, RESOURCE_PHASES, Phase
from jobs.models import Attempt, Group, GroupQuota, Job, JobArray
from jobs.prepared import Prepared
from jobs.services.backend_records import NODES_OF

from .backends.base import Backend
from .core import ArrayState, GroupState, QueuedJob, QuotaLimits, Reason, ReplicaPlacement, RunningJob
from .estimate import HeldJob
from .values import Node


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
    arrays: dict[int, ArrayState] = field(default_factory=dict)  # the queued members' arrays with a %K limit


QueueInfo = tuple[str, str, str, int | None]  # phase, reason, message, queue position
JobKind = tuple[int, int, str, int, int]  # user, group, name, instance type, active deadline (seconds)


HEAD_ROWS = 1  # each group's first jobs behind its head that a pass reads at first (× 4 while not enough)
QUEUED_FIELDS = (
    "id", "name", "group_id", "user_id", "priority", "queued_at", "replicas", "gpu", "cpu_millicores",
    "memory_bytes", "preemptible", "phase", "reason", "message", "retry_at", "instance_type_id",
    "active_deadline_seconds", "estimated_start", "estimate_basis", "array_id",
)


def snapshot(backend: Backend, *, head_rows: Mapping[int, int] | None = None) -> Snapshot:
    """Read what the decision and the estimates need, in a handful of queries whatever the length of the queues.

    Of the queued jobs only these: every queued job not already waiting behind its group's head (new,
    inadmissible, or pending for another reason: the heads, the jobs user quotas skip past, the requeued, the
    nominated), and of the jobs behind a head (PENDING, BlockedByQueueHead) each group's first ``head_rows`` in queue
    order (``HEAD_ROWS`` by default): the others keep waiting behind it. Fewer read than asked: the group's whole
    queue was read."""
    groups = {gid: GroupState(id=gid, name=name, queue_stopped=stopped) for gid, name, stopped in GROUPS.all()}
    for gid, resource, quota, limit, user_quota in QUOTAS.all():
        groups[gid].quotas[resource] = QuotaLimits(quota, limit, user_quota)
    stopped = [gid for gid, g in groups.items() if g.queue_stopped]
    if head_rows is None:
        head_rows = {gid: HEAD_ROWS for gid in groups if gid not in stopped}

    rows = {r[0]: r for r in UNSETTLED.all(stopped=stopped)}
    if stopped:  # a stopped queue: every job in it becomes inadmissible
        rows.update((r[0], r) for r in IN_STOPPED.all(stopped=stopped))
    prefix: dict[int, set[int]] = {gid: set() for gid in head_rows}
    for r in queue_heads(head_rows):
        rows[r[0]] = r
        prefix[r[2]].add(r[0])

    queued, shown, kinds, estimates = [], {}, {}, {}
    for (id_, name, group_id, user_id, priority, queued_at, replicas, gpu, cpu, memory, preemptible, phase, reason,
         message, retry_at, itype, deadline, estimated_start, estimate_basis, array_id) in rows.values():
        queued.append(QueuedJob(
            id=id_, name=name, group_id=group_id, user_id=user_id, priority=priority, queued_at=queued_at,
            replicas=replicas, preemptible=preemptible, not_before=retry_at,
            request={"gpu": gpu, "cpu": cpu, "memory": memory},
            nominated=phase == Phase.PENDING and reason == Reason.PREEMPTING, array_id=array_id,
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
                    {gid: (head_rows[gid], ids) for gid, ids in prefix.items()},
                    array_limits({j.array_id for j in queued if j.array_id is not None}))


def queued_read_whole(stopped: Iterable[int] | QuerySet) -> tuple[QuerySet, QuerySet]:
    """The queued jobs every pass reads whole, as two querysets (``stopped``: the ids of the groups whose queue is
    stopped, or a query of them): every queued job not waiting behind its group's head (new, inadmissible, or
    pending for another reason) and not waiting on a dependency; and every pending job of a stopped group."""
    unsettled = (
        Job.objects.filter(phase__in=QUEUED_PHASES, dependency_wait=False)
        .exclude(phase=Phase.PENDING, reason=Reason.BLOCKED)
        .exclude(phase=Phase.INADMISSIBLE, reason=Reason.QUEUE_STOPPED, group_id__in=stopped)
    )
    return unsettled, Job.objects.filter(phase=Phase.PENDING, group_id__in=stopped)


def array_limits(array_ids: set[int]) -> dict[int, ArrayState]:
    """The arrays of ``array_ids`` that have a ``%K`` limit, each with how many of its members hold resources now:
    one query, whatever the number of arrays and members."""
    if not array_ids:
        return {}
    rows = (JobArray.objects.filter(pk__in=array_ids, max_running__isnull=False)
            .annotate(holding=Count("members", filter=Q(members__phase__in=sorted(RESOURCE_PHASES))))
            .values_list("id", "max_running", "holding"))
    return {id_: ArrayState(id_, max_running, holding) for id_, max_running, holding in rows}


HOLDING_FIELDS = (
    "id", "name", "group_id", "user_id", "priority", "preemptible", "replicas", "admitted_at", "gpu",
    "cpu_millicores", "memory_bytes", "over_quota", "phase", "current_attempt__placement", "instance_type_id",
    "active_deadline_seconds", "current_attempt__backend", "current_attempt__gpu", "array_id",
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
     placement_json, itype, deadline, attempt_backend, attempt_gpu, array_id) = row
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
                     admitted_at=admitted_at, placement=placement, terminating=terminating, array_id=array_id),
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
            return [_holding_of(row, backend_name) for row in HOLDING_ROWS.all()]
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
HOLDING_ROWS = Prepared(lambda: Job.objects.filter(phase__in=sorted(RESOURCE_PHASES)).values_list(*HOLDING_FIELDS))


def queue_heads(limits: Mapping[int, int]) -> list[tuple]:
    """The first ``limits[group]`` jobs waiting behind the head of each group, in queue order, as
    ``QUEUED_FIELDS`` tuples: one query (on PostgreSQL a top-N index scan per group, whatever the length of its
    queue). The group's other queued jobs are read anyway (``snapshot``)."""
    if not limits:
        return []
    by_limit: dict[int, list[int]] = {}
    for gid, n in limits.items():
        by_limit.setdefault(n, []).append(gid)
    found: list[tuple] = []
    for n, gids in by_limit.items():
        if connection.vendor == "postgresql":
            columns = ", ".join(f"j.{Job._meta.get_field(f).column}" for f in QUEUED_FIELDS)
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT h.* FROM unnest(%s::bigint[]) AS g(id) CROSS JOIN LATERAL " + heads_sql(columns, "%s"),
                    [gids, *HEADS_PARAMS, n])
                found.extend(cursor.fetchall())
        else:
            found.extend(HEADS.all(groups=gids, limit=n))
    return found


# A pass's reads, compiled once (jobs.prepared).
GROUPS = Prepared(lambda: Group.objects.values_list("id", "name", "queue_stopped"))
QUOTAS = Prepared(lambda: GroupQuota.objects.values_list("group_id", "resource", "quota", "limit", "user_quota"))
UNSETTLED = Prepared(lambda stopped: queued_read_whole(stopped)[0].values_list(*QUEUED_FIELDS), stopped=list)
IN_STOPPED = Prepared(lambda stopped: queued_read_whole(stopped)[1].values_list(*QUEUED_FIELDS), stopped=list)
# Not PostgreSQL: the first ``limit`` jobs behind the head of each group of ``groups``, by a window function.
HEADS = Prepared(lambda groups, limit: Job.objects.filter(
    phase=Phase.PENDING, reason=Reason.BLOCKED, group_id__in=groups, dependency_wait=False)
    .annotate(rank=Window(RowNumber(), partition_by=F("group_id"),
                          order_by=[F("priority").desc(), F("queued_at").asc(), F("id").asc()]))
    .filter(rank__lte=limit).values_list(*QUEUED_FIELDS), groups=list, limit=int)


HEADS_PARAMS = (Phase.PENDING, Reason.BLOCKED)


def heads_sql(columns: str, limit: str) -> str:
    """PostgreSQL: ``(SELECT columns ...) h``, the first ``limit`` jobs waiting behind the head of group ``g.id``,
    in queue order, for a ``CROSS JOIN LATERAL`` (parameters: ``HEADS_PARAMS``, then those of ``limit``)."""
    return (f"(SELECT {columns} FROM {Job._meta.db_table} j WHERE j.group_id = g.id AND NOT j.dependency_wait "
            f"AND j.phase = %s AND j.reason = %s ORDER BY j.priority DESC, j.queued_at, j.id LIMIT {limit}) h")


def nodes_with_free(backend: str, placed: list[tuple[dict[str, int], tuple[ReplicaPlacement, ...]]]) -> list[Node]:
    """The nodes the scheduler last recorded for ``backend``, minus what the attempts holding resources have placed
    on them (``placed``: each one's request per replica and placement, read with the jobs holding resources), as
    ``jobs.selectors.nodes_with_usage`` counts them. Database only: nothing here waits on the cluster while the
    group rows are locked; one query."""
    nodes = {name: Node(name, dict(allocatable), dict(allocatable), None)
             for name, allocatable in NODES_OF.all(backend=backend)}
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
