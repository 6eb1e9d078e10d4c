"""The admission decision: a pure function of a snapshot. No ORM, no I/O, no clock.

Pipeline of one pass (Kueue-style): order the queued jobs → for each, in order, check it can ever fit
(else INADMISSIBLE) → check the user quota (a miss waits without blocking anyone) → the group quota and the
cluster capacity (a miss waits and holds the group's queue) → admit, charging the snapshot so later jobs
of the same pass see the usage. Every job ends with an explicit outcome, a reason and a message.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

RESOURCES = ("gpu", "cpu", "memory")

Resources = Mapping[str, int]


class Verdict(enum.StrEnum):
    ADMIT = "admit"
    WAIT = "wait"
    INADMISSIBLE = "inadmissible"


class Reason(enum.StrEnum):
    ADMITTED = "Admitted"
    USER_QUOTA = "UserQuota"
    GROUP_QUOTA = "GroupQuota"
    CAPACITY = "Capacity"
    BLOCKED = "BlockedByQueueHead"
    QUEUE_STOPPED = "QueueStopped"
    EXCEEDS_USER_QUOTA = "ExceedsUserQuota"
    EXCEEDS_GROUP_QUOTA = "ExceedsGroupQuota"
    NO_NODE_FITS = "NoNodeFits"


@dataclass(frozen=True)
class QuotaLimits:
    """None means unlimited."""

    quota: int | None = None
    limit: int | None = None
    user_quota: int | None = None

    @property
    def ceiling(self) -> int | None:
        """Most the group may ever hold for non-preemptible jobs: the guaranteed quota."""
        return self.quota


@dataclass
class GroupState:
    id: int
    name: str
    quotas: dict[str, QuotaLimits] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=dict)
    user_usage: dict[int, dict[str, int]] = field(default_factory=dict)
    queue_stopped: bool = False


@dataclass(frozen=True)
class QueuedJob:
    id: int
    name: str
    group_id: int
    user_id: int
    priority: int
    queued_at: datetime
    replicas: int
    request: Resources  # per replica

    @property
    def total(self) -> dict[str, int]:
        return {r: self.request.get(r, 0) * self.replicas for r in RESOURCES}

    @property
    def order_key(self) -> tuple[int, datetime, int]:
        return (-self.priority, self.queued_at, self.id)


@dataclass
class Node:
    """A node's allocatable and free resources; a resource it does not list is not limited by it."""

    name: str
    allocatable: dict[str, int]
    free: dict[str, int]
    free_gpu_ids: list[int] | None = None


@dataclass(frozen=True)
class ReplicaPlacement:
    node: str
    gpu_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Outcome:
    job_id: int
    verdict: Verdict
    reason: Reason
    message: str
    position: int | None = None
    placement: tuple[ReplicaPlacement, ...] = ()


def fmt_amount(resource: str, amount: int | None) -> str:
    if amount is None:
        return "unlimited"
    if resource == "gpu":
        return f"{amount} GPU"
    if resource == "cpu":
        return f"{amount / 1000:g} CPU" if amount % 100 == 0 else f"{amount}m CPU"
    gib = amount / (1 << 30)
    return f"{gib:g} GiB" if amount % (1 << 20) == 0 else f"{amount} B memory"


def _label(resource: str) -> str:
    return {"gpu": "GPU", "cpu": "CPU", "memory": "memory"}[resource]


def _first_excess(
    request: Mapping[str, int], used: Mapping[str, int], limits: Mapping[str, int | None]
) -> tuple[str, int, int | None] | None:
    """The first resource where used + request goes over its limit, as (resource, used, limit)."""
    for r in RESOURCES:
        limit = limits.get(r)
        need = request.get(r, 0)
        if limit is not None and need > 0 and used.get(r, 0) + need > limit:
            return r, used.get(r, 0), limit
    return None


def _place(job: QueuedJob, nodes: list[Node], *, use_free: bool) -> list[ReplicaPlacement] | None:
    """First-fit every replica onto the nodes; None if some replica finds no room. Does not change nodes."""
    room = [dict(n.free if use_free else n.allocatable) for n in nodes]
    gpu_ids = [list(n.free_gpu_ids or []) if use_free else list(range(n.allocatable.get("gpu", 0))) for n in nodes]
    placement: list[ReplicaPlacement] = []
    for _ in range(job.replicas):
        for i, node in enumerate(nodes):
            if all(job.request.get(r, 0) <= room[i].get(r, job.request.get(r, 0)) for r in RESOURCES):
                for r in RESOURCES:
                    if r in room[i]:
                        room[i][r] -= job.request.get(r, 0)
                ids: tuple[int, ...] = ()
                if nodes[i].free_gpu_ids is not None:
                    ids = tuple(gpu_ids[i][: job.request.get("gpu", 0)])
                    del gpu_ids[i][: job.request.get("gpu", 0)]
                placement.append(ReplicaPlacement(node=node.name, gpu_ids=ids))
                break
        else:
            return None
    return placement


def _commit_placement(job: QueuedJob, nodes: list[Node], placement: list[ReplicaPlacement]) -> None:
    by_name = {n.name: n for n in nodes}
    for p in placement:
        node = by_name[p.node]
        for r in RESOURCES:
            if r in node.free:
                node.free[r] -= job.request.get(r, 0)
        if node.free_gpu_ids is not None:
            node.free_gpu_ids = [g for g in node.free_gpu_ids if g not in p.gpu_ids]


def _never_fits(job: QueuedJob, group: GroupState, nodes: list[Node]) -> tuple[Reason, str] | None:
    total = job.total
    if group.queue_stopped:
        return Reason.QUEUE_STOPPED, f"the queue of {group.name} is stopped by an admin"
    for r in RESOURCES:
        q = group.quotas.get(r, QuotaLimits())
        if q.user_quota is not None and total[r] > q.user_quota:
            return Reason.EXCEEDS_USER_QUOTA, (
                f"asks {fmt_amount(r, total[r])}, more than the user {_label(r)} quota "
                f"{fmt_amount(r, q.user_quota)} in {group.name}"
            )
        if q.ceiling is not None and total[r] > q.ceiling:
            return Reason.EXCEEDS_GROUP_QUOTA, (
                f"asks {fmt_amount(r, total[r])}, more than the group {_label(r)} quota "
                f"{fmt_amount(r, q.ceiling)} of {group.name}"
            )
    if nodes and _place(job, nodes, use_free=False) is None:
        return Reason.NO_NODE_FITS, "no node of the cluster can ever hold " + (
            "a replica" if job.replicas == 1 else f"all {job.replicas} replicas"
        ) + " of this job"
    return None


def decide(groups: Mapping[int, GroupState], jobs: Iterable[QueuedJob], nodes: list[Node]) -> list[Outcome]:
    """Decide, for every queued job, admit / wait / inadmissible. Mutates nothing it is given.

    ``nodes`` empty means capacity is not checked (e.g. a Kubernetes backend with capacity checking off).
    """
    groups = {
        gid: GroupState(
            id=g.id,
            name=g.name,
            quotas=g.quotas,
            usage=dict(g.usage),
            user_usage={u: dict(v) for u, v in g.user_usage.items()},
            queue_stopped=g.queue_stopped,
        )
        for gid, g in groups.items()
    }
    nodes = [
        Node(n.name, dict(n.allocatable), dict(n.free), None if n.free_gpu_ids is None else list(n.free_gpu_ids))
        for n in nodes
    ]
    # The job holding each group's queue (strict FIFO behind a group-quota or capacity miss).
    head: dict[int, tuple[QueuedJob, Reason]] = {}
    outcomes: list[Outcome] = []

    ordered = sorted(jobs, key=lambda j: j.order_key)
    for job in ordered:
        group = groups[job.group_id]
        total = job.total

        never = _never_fits(job, group, nodes)
        if never:
            outcomes.append(Outcome(job.id, Verdict.INADMISSIBLE, never[0], never[1]))
            continue

        user_used = group.user_usage.setdefault(job.user_id, {})
        user_limits = {r: group.quotas.get(r, QuotaLimits()).user_quota for r in RESOURCES}
        miss = _first_excess(total, user_used, user_limits)
        if miss:
            r, used, limit = miss
            outcomes.append(Outcome(job.id, Verdict.WAIT, Reason.USER_QUOTA, (
                f"waiting for user {_label(r)} quota in {group.name}: {fmt_amount(r, used)} used of "
                f"{fmt_amount(r, limit)}, asks {fmt_amount(r, total[r])}"
            )))
            continue

        if job.group_id in head:
            blocker, why = head[job.group_id]
            outcomes.append(Outcome(job.id, Verdict.WAIT, Reason.BLOCKED, (
                f"behind job #{blocker.id} ({blocker.name}), which waits for "
                + ("group quota" if why == Reason.GROUP_QUOTA else "cluster capacity")
            )))
            continue

        group_limits = {r: group.quotas.get(r, QuotaLimits()).ceiling for r in RESOURCES}
        miss = _first_excess(total, group.usage, group_limits)
        if miss:
            r, used, limit = miss
            head[job.group_id] = (job, Reason.GROUP_QUOTA)
            outcomes.append(Outcome(job.id, Verdict.WAIT, Reason.GROUP_QUOTA, (
                f"waiting for group {_label(r)} quota of {group.name}: {fmt_amount(r, used)} used of "
                f"{fmt_amount(r, limit)}, asks {fmt_amount(r, total[r])}"
            )))
            continue

        placement: list[ReplicaPlacement] | None = []
        if nodes:
            placement = _place(job, nodes, use_free=True)
            if placement is None:
                head[job.group_id] = (job, Reason.CAPACITY)
                free_gpu = sum(n.free.get("gpu", 0) for n in nodes)
                outcomes.append(Outcome(job.id, Verdict.WAIT, Reason.CAPACITY, (
                    f"waiting for cluster capacity: {free_gpu} GPU free, asks {fmt_amount('gpu', total['gpu'])}"
                    if total["gpu"] > free_gpu else "waiting for cluster capacity: no node has room"
                )))
                continue
            _commit_placement(job, nodes, placement)

        for r in RESOURCES:
            group.usage[r] = group.usage.get(r, 0) + total[r]
            user_used[r] = user_used.get(r, 0) + total[r]
        outcomes.append(Outcome(job.id, Verdict.ADMIT, Reason.ADMITTED, "admitted", placement=tuple(placement)))

    return _with_positions(outcomes, {j.id: j.group_id for j in ordered})


def _with_positions(outcomes: list[Outcome], group_of: Mapping[int, int]) -> list[Outcome]:
    """Number the waiting jobs of each group 1..n in queue order."""
    counters: dict[int, int] = {}
    result = []
    for o in outcomes:
        if o.verdict == Verdict.WAIT:
            gid = group_of[o.job_id]
            counters[gid] = counters.get(gid, 0) + 1
            o = Outcome(o.job_id, o.verdict, o.reason, o.message, counters[gid])
        result.append(o)
    return result
