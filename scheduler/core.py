"""The admission decision: a pure function of a snapshot. No ORM, no I/O, no clock.

Pipeline of one pass (Kueue-style): order the queued jobs → for each, in order, check it can ever fit
(else INADMISSIBLE) → once a group's queue is held, every later job of that group waits behind its head and is
not looked at further → check its array's ``%K`` limit and the user quota (a miss waits without blocking anyone)
→ the group quota and the cluster capacity (a miss waits and holds the group's queue) → admit, charging the
snapshot so later jobs of the same pass see the usage. Every job ends with an explicit outcome, a reason and a message.

So a pass does real work only for each group's head (plus the jobs its user quota skips past): the jobs behind a
held head cost a dictionary lookup each, and a caller may leave them out altogether (they wait behind the head).
Placement (``scheduler.placement``) keeps every node's free resources and an index of the nodes by free GPUs,
charged in place: a replica goes to the node with the fewest free GPUs that holds it (best fit). Whether a job would
fit once some jobs have ended is asked of an overlay of only the nodes they free (``Capacity.first_fit``), where it
would go once every terminating job has ended of a view kept up to date (``scheduler.capacity_index``), and the
preemption candidates are indexed by group (the preemptible jobs) and over-quota: no question scans every node or
every running job.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from jobs.rules import RESOURCES, QuotaLimits, fmt_amount, priority_name

from .capacity_index import SoonFree
from .placement import Capacity, ReplicaPlacement, Resources, place_first_fit
from .values import Node


class Verdict(enum.StrEnum):
    ADMIT = "admit"
    WAIT = "wait"
    INADMISSIBLE = "inadmissible"
    PREEMPT = "preempt"  # a running job to evict (training jobs come back PENDING)


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
    PREEMPTING = "Preempting"
    PREEMPTED = "Preempted"
    REQUEUED = "Requeued"
    ARRAY_LIMIT = "ArrayLimit"


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
    preemptible: bool = False
    not_before: datetime | None = None  # requeued: not admitted before this time
    # It preempted others and waits for them to end (reason Preempting): what they free is reserved for it, and it
    # is decided before every other job, so the jobs it evicted (queued again, maybe earlier) cannot take it back.
    nominated: bool = False
    array_id: int | None = None  # a member of this array (JobArray): its ``%K`` limit applies

    @property
    def total(self) -> dict[str, int]:
        return {r: self.request.get(r, 0) * self.replicas for r in RESOURCES}

    @property
    def order_key(self) -> tuple[bool, int, datetime, int]:
        return (not self.nominated, -self.priority, self.queued_at, self.id)



@dataclass(frozen=True)
class ArrayState:
    """An array with a ``%K`` limit: at most ``max_running`` of its members hold resources at once; ``holding`` do
    now."""

    id: int
    max_running: int
    holding: int = 0


@dataclass(frozen=True)
class RunningJob:
    """A job holding resources: a candidate victim for preemption, or (terminating) resources soon free."""

    id: int
    name: str
    group_id: int
    priority: int
    preemptible: bool
    replicas: int
    request: Resources
    admitted_at: datetime
    over_quota: bool = False
    terminating: bool = False
    placement: tuple[ReplicaPlacement, ...] = ()

    @property
    def total(self) -> dict[str, int]:
        return {r: self.request.get(r, 0) * self.replicas for r in RESOURCES}


@dataclass(frozen=True)
class Outcome:
    job_id: int
    verdict: Verdict
    reason: Reason
    message: str
    position: int | None = None
    placement: tuple[ReplicaPlacement, ...] = ()
    over_quota: bool = False  # admitted beyond the group quota (preemptible, on idle resources)
    by: int | None = None  # PREEMPT: the job that needs the resources


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


def _never_fits(
    job: QueuedJob, group: GroupState, nodes: list[Node], fits_empty: dict[tuple, bool]
) -> tuple[Reason, str] | None:
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
        ceiling = q.ceiling(job.preemptible)
        if ceiling is not None and total[r] > ceiling:
            return Reason.EXCEEDS_GROUP_QUOTA, (
                f"asks {fmt_amount(r, total[r])}, more than the group {_label(r)} "
                f"{'limit' if ceiling != q.quota else 'quota'} {fmt_amount(r, ceiling)} of {group.name}"
            )
    shape = (job.replicas, tuple(job.request.get(r, 0) for r in RESOURCES))
    if nodes and shape not in fits_empty:  # many jobs share a few shapes: place each shape once per pass
        fits_empty[shape] = place_first_fit(job, nodes, use_free=False) is not None
    if nodes and not fits_empty[shape]:
        return Reason.NO_NODE_FITS, "no node of the cluster can ever hold " + (
            "a replica" if job.replicas == 1 else f"all {job.replicas} replicas"
        ) + " of this job"
    return None


class _Decider:
    """One pass's working state: usage and free capacity charged as jobs are admitted or evicted."""

    def __init__(self, groups: Mapping[int, GroupState], running: Iterable[RunningJob], nodes: list[Node],
                 now: datetime | None, arrays: Mapping[int, ArrayState] | None = None):
        self.now = now
        self.arrays = {a.id: (a.max_running, a.holding) for a in (arrays or {}).values()}
        self.array_holding = {i: holding for i, (_, holding) in self.arrays.items()}  # charged as members are admitted
        self.groups = {
            gid: GroupState(g.id, g.name, g.quotas, dict(g.usage), {u: dict(v) for u, v in g.user_usage.items()},
                            g.queue_stopped)
            for gid, g in groups.items()
        }
        self.nodes = Capacity(nodes)
        self.running = [j for j in running if not j.terminating]
        self.terminating = [j for j in running if j.terminating]
        # The preemption candidates, indexed: each group's preemptible jobs, and the jobs running over their quota.
        self.preemptible_of: dict[int, list[RunningJob]] = {}
        for j in self.running:
            if j.preemptible:
                self.preemptible_of.setdefault(j.group_id, []).append(j)
        self.over_quota = [j for j in self.running if j.over_quota]
        self.victims: set[int] = set()
        # Terminating jobs whose room is promised to a job (its victims, or what a nominated job waits for): no
        # other job of the pass counts on it, so several jobs may preempt in one pass, each for itself.
        self.claimed: set[int] = set()
        # The terminating jobs not claimed yet, in order, all and by group: what a job may count on without a scan.
        self.unclaimed: dict[int, RunningJob] = {j.id: j for j in self.terminating}
        self.unclaimed_of: dict[int, dict[int, RunningJob]] = {}
        for j in self.terminating:
            self.unclaimed_of.setdefault(j.group_id, {})[j.id] = j
        self.soon_free: SoonFree | None = None  # the nodes once every terminating job has ended, made when asked
        self.fits_empty: dict[tuple, bool] = {}  # job shape → fits the empty cluster
        self.never: dict[tuple, tuple[Reason, str] | None] = {}  # (group, shape, preemptible) → why it never fits
        self.head: dict[int, tuple[QueuedJob, Reason]] = {}  # the job holding each group's queue
        self.behind: dict[int, str] = {}  # what the jobs behind that job wait for
        self.waiting: dict[int, int] = {}  # each group's waiting jobs so far: the next one's position
        self.outcomes: list[Outcome] = []
        self.ceilings: dict[tuple[int, bool], dict[str, int | None]] = {}  # (group, preemptible) → most it may hold

    def quota_room(self, job: QueuedJob, freed: Iterable[RunningJob]) -> tuple[str, int, int | None] | None:
        group = self.groups[job.group_id]
        used: Mapping[str, int] = group.usage
        own = [v for v in freed if v.group_id == job.group_id]
        if own:
            used = dict(used)
            for v in own:
                for r in RESOURCES:
                    used[r] = used.get(r, 0) - v.total[r]
        key = (job.group_id, job.preemptible)
        limits = self.ceilings.get(key)
        if limits is None:
            limits = self.ceilings[key] = {r: group.quotas.get(r, QuotaLimits()).ceiling(job.preemptible)
                                           for r in RESOURCES}
        return _first_excess(job.total, used, limits)

    def fits(self, job: QueuedJob, freed: list[RunningJob], *, check_quota: bool) -> bool:
        if check_quota and self.quota_room(job, freed):
            return False
        return not self.nodes or self.nodes.first_fit(job, freed) is not None

    def choose_victims(self, job: QueuedJob, candidates: list[RunningJob], *, check_quota: bool
                       ) -> list[RunningJob] | None:
        """Fewest evictions, lowest priority then newest first, that make room; None if none can."""
        soon_free = self.soon_free_for(job, check_quota=check_quota)
        if not soon_free and not candidates:  # it did not fit as things are, and nothing would change them
            return None
        if self.fits(job, soon_free, check_quota=check_quota):
            return []
        chosen: list[RunningJob] = []
        for c in candidates:
            chosen.append(c)
            if self.fits(job, soon_free + chosen, check_quota=check_quota):
                break
        else:
            return None
        for c in reversed(chosen[:-1]):  # drop any that turned out not to be needed
            trial = [x for x in chosen if x is not c]
            if self.fits(job, soon_free + trial, check_quota=check_quota):
                chosen = trial
        return chosen

    def candidates(self, job: QueuedJob, *, reclaim: bool) -> list[RunningJob]:
        """Running jobs ``job`` may evict: lower-priority preemptible ones of its group; when it reclaims its
        group's guaranteed quota, also the over-quota jobs of other groups (those first)."""
        def order(j: RunningJob) -> tuple:
            return (j.priority, -j.admitted_at.timestamp(), -j.id)

        own = sorted((j for j in self.preemptible_of.get(job.group_id, ())
                      if j.id not in self.victims and j.priority < job.priority), key=order)
        if not reclaim:
            return own
        others = sorted((j for j in self.over_quota if j.id not in self.victims and j.group_id != job.group_id),
                        key=order)
        return others + own

    def preempt(self, job: QueuedJob, victims: list[RunningJob], why: str) -> None:
        group = self.groups[job.group_id]
        for v in victims:
            self.victims.add(v.id)
            self.claim([v])
            self.terminating.append(v)
            if self.soon_free is not None:
                self.soon_free.add(v)
            if v.group_id == job.group_id:
                cause = f"to free {why} of {group.name}"
            else:
                cause = f"to give {group.name} back its guaranteed quota (this job ran over its group's quota)"
            self.outcomes.append(Outcome(v.id, Verdict.PREEMPT, Reason.PREEMPTED, (
                f"preempted by job #{job.id} ({job.name}, priority {priority_name(job.priority)}) {cause}"
            ), by=job.id))
        self.reserve_soon_free(job)
        self.hold(job, Reason.PREEMPTING)
        names = ", ".join(f"#{v.id}" for v in victims)
        self.wait(job, Reason.PREEMPTING, f"preempting {names} to free {why}; starts once they have terminated",
                  holds_queue=False)

    def await_victims(self, job: QueuedJob, why: str, *, check_quota: bool) -> None:
        """A nominated job whose room is being freed by terminating jobs: it keeps its nomination, and what is
        already free of the placement it will get is reserved for it, so no later job of this pass takes it."""
        self.claim_terminating(job, check_quota=check_quota)
        self.reserve_soon_free(job)
        self.hold(job, Reason.PREEMPTING)
        self.wait(job, Reason.PREEMPTING, (
            f"waiting for the jobs it preempted to terminate to free {why}; their resources are reserved for it"
        ), holds_queue=False)

    def claim_terminating(self, job: QueuedJob, *, check_quota: bool) -> None:
        """A nominated job waiting for terminating jobs: the fewest of them (as ``choose_victims`` counts them)
        that make its room are promised to it."""
        soon_free = self.soon_free_for(job, check_quota=check_quota)
        claim: list[RunningJob] = []
        for t in soon_free:
            if self.fits(job, claim, check_quota=check_quota):
                break
            claim.append(t)
        self.claim(claim)

    def soon_free_for(self, job: QueuedJob, *, check_quota: bool) -> list[RunningJob]:
        """The terminating jobs not claimed yet whose room ``job`` may count on: its group's when its group quota
        is checked too, else all."""
        return list((self.unclaimed_of.get(job.group_id, {}) if check_quota else self.unclaimed).values())

    def claim(self, jobs: Iterable[RunningJob]) -> None:
        for t in jobs:
            self.claimed.add(t.id)
            self.unclaimed.pop(t.id, None)
            self.unclaimed_of.get(t.group_id, {}).pop(t.id, None)

    def reserve_soon_free(self, job: QueuedJob) -> None:
        """What is already free of the placement ``job`` gets once the terminating jobs are gone is reserved for
        it, so no later (lower-priority) job of this pass takes the room its preemption is freeing."""
        if not self.nodes:
            return
        if self.soon_free is None:
            self.soon_free = SoonFree(self.nodes, self.terminating)
        placement = self.soon_free.first_fit(job)
        if placement is not None:
            self.nodes.reserve(job, placement)

    def hold(self, job: QueuedJob, reason: Reason) -> None:
        """``job`` holds its group's queue: every later job of the group waits behind it."""
        self.head[job.group_id] = (job, reason)
        self.behind[job.group_id] = behind_message(job.id, job.name, reason)

    def wait(self, job: QueuedJob, reason: Reason, message: str, *, holds_queue: bool) -> None:
        if holds_queue:
            self.hold(job, reason)
        position = self.waiting[job.group_id] = self.waiting.get(job.group_id, 0) + 1
        self.outcomes.append(Outcome(job.id, Verdict.WAIT, reason, message, position=position))

    def decide(self, job: QueuedJob) -> None:
        group = self.groups[job.group_id]
        # Whether a job can ever fit depends on its group, shape and preemptibility only: asked once per pass each.
        request = job.request
        key = (job.group_id, job.replicas, job.preemptible, request.get("gpu", 0), request.get("cpu", 0),
               request.get("memory", 0))
        if key in self.never:
            never = self.never[key]
        else:
            never = self.never[key] = _never_fits(job, group, self.nodes.nodes, self.fits_empty)
        if never:
            self.outcomes.append(Outcome(job.id, Verdict.INADMISSIBLE, never[0], never[1]))
            return

        behind = self.behind.get(job.group_id)
        if behind is not None:  # the queue is held: waits behind its head, nothing else is looked at
            self.wait(job, Reason.BLOCKED, behind, holds_queue=False)
            return

        total = job.total

        limit = self.arrays.get(job.array_id) if job.array_id is not None else None
        if limit is not None and self.array_holding[job.array_id] >= limit[0]:  # its array's %K: waits, holds no one
            self.wait(job, Reason.ARRAY_LIMIT, f"array {job.array_id} runs at most {limit[0]} at once",
                      holds_queue=False)
            return

        user_used = group.user_usage.setdefault(job.user_id, {})
        user_limits = {r: group.quotas.get(r, QuotaLimits()).user_quota for r in RESOURCES}
        miss = _first_excess(total, user_used, user_limits)
        if miss:  # the user's own quota: waits without holding anyone else
            r, used, limit = miss
            self.wait(job, Reason.USER_QUOTA, (
                f"waiting for user {_label(r)} quota in {group.name}: {fmt_amount(r, used)} used of "
                f"{fmt_amount(r, limit)}, asks {fmt_amount(r, total[r])}"
            ), holds_queue=False)
            return

        if job.not_before and self.now and job.not_before > self.now:  # backing off after a requeue
            self.wait(job, Reason.REQUEUED, (
                f"requeued after a stuck start; eligible again at {job.not_before:%Y-%m-%d %H:%M:%S %Z}"
            ), holds_queue=False)
            return

        miss = self.quota_room(job, [])
        if miss:
            r, used, limit = miss
            # A preemptible job is held at the group's limit (it may borrow up to it), others at the quota.
            why = f"group {_label(r)} {'quota' if limit == group.quotas.get(r, QuotaLimits()).quota else 'limit'}"
            victims = self.choose_victims(job, self.candidates(job, reclaim=False), check_quota=True)
            if victims:
                self.preempt(job, victims, why)
                return
            if victims == [] and job.nominated:
                self.await_victims(job, why, check_quota=True)
                return
            soon = " (jobs are terminating)" if victims == [] else ""
            self.wait(job, Reason.GROUP_QUOTA, (
                f"waiting for {why} of {group.name}: {fmt_amount(r, used)} used of "
                f"{fmt_amount(r, limit)}, asks {fmt_amount(r, total[r])}{soon}"
            ), holds_queue=True)
            return

        quotas = {r: group.quotas.get(r, QuotaLimits()).quota for r in RESOURCES}
        over_quota = _first_excess(total, group.usage, quotas) is not None
        placement: list[ReplicaPlacement] | None = []
        if self.nodes:
            placement = self.nodes.place(job)
            if placement is None:
                victims = self.choose_victims(job, self.candidates(job, reclaim=not over_quota), check_quota=False)
                if victims:
                    self.preempt(job, victims, "cluster capacity")
                    return
                if victims == [] and job.nominated:
                    self.await_victims(job, "cluster capacity", check_quota=False)
                    return
                free_gpu = self.nodes.free_gpu
                self.wait(job, Reason.CAPACITY, (
                    f"waiting for cluster capacity: {free_gpu} GPU free, asks {fmt_amount('gpu', total['gpu'])}"
                    if total["gpu"] > free_gpu else "waiting for cluster capacity: no node has room"
                ), holds_queue=True)
                return

        for r in RESOURCES:
            group.usage[r] = group.usage.get(r, 0) + total[r]
            user_used[r] = user_used.get(r, 0) + total[r]
        if limit is not None:
            self.array_holding[job.array_id] += 1
        message = "admitted over its group's quota, on idle resources (preemptible)" if over_quota else "admitted"
        if job.nominated:
            message += ", on the resources freed by the jobs it preempted"  # what job_admit's event says too
        self.outcomes.append(Outcome(job.id, Verdict.ADMIT, Reason.ADMITTED, message, placement=tuple(placement),
                                     over_quota=over_quota))


def decide(
    groups: Mapping[int, GroupState],
    jobs: Iterable[QueuedJob],
    nodes: list[Node],
    running: Iterable[RunningJob] = (),
    now: datetime | None = None,
    arrays: Mapping[int, ArrayState] | None = None,
) -> list[Outcome]:
    """Decide, for every queued job, admit / wait / inadmissible, and which running jobs to preempt.

    Mutates nothing it is given. ``nodes`` empty means capacity is not checked (e.g. a Kubernetes backend with
    capacity checking off). ``running`` are the jobs holding resources (candidates for preemption). ``now`` is
    the pass's clock, for requeued jobs' delays. ``arrays``: the arrays with a ``%K`` limit ({id: ArrayState}); a
    member of one whose ``max_running`` members already hold resources (or were admitted earlier in this pass)
    waits with reason ArrayLimit without holding its group's queue, as a user-quota wait.

    Once a job holds its group's queue (group quota, capacity, preempting), every later job of the group waits
    with reason BlockedByQueueHead and ``behind_message`` of that head, unless it can never fit; neither its user
    quota nor its requeue delay is looked at. Waiting jobs get their position (1..n per group, in queue order)
    among the waiting jobs given, so a caller that gives only each group's jobs up to its head gets their
    positions right, and may derive the others' (see ``jobs.selectors.queue_positions``).
    """
    decider = _Decider(groups, running, nodes, now, arrays)
    for job in sorted(jobs, key=_order_key):
        decider.decide(job)
    return decider.outcomes


def _order_key(job: QueuedJob) -> tuple[bool, int, datetime, int]:
    return (not job.nominated, -job.priority, job.queued_at, job.id)


HOLDING_REASONS = {Reason.GROUP_QUOTA: "group quota", Reason.CAPACITY: "cluster capacity",
                   Reason.PREEMPTING: "the jobs it preempted to terminate"}


def behind_message(head_id: int, head_name: str, head_reason: str) -> str:
    """What a job waiting behind the head of its group's queue shows: the head, and what the head waits for."""
    return f"behind job #{head_id} ({head_name}), which waits for {HOLDING_REASONS[Reason(head_reason)]}"
