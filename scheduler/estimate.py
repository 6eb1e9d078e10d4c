"""When will each waiting job start? A pure forward simulation of the queues. No ORM, no I/O, no clock.

From ``now``, the jobs holding resources end one after another (``admitted_at`` + their expected duration); at
each such moment the admission decision itself (``scheduler.core.decide``, no preemption assumed) is asked which
waiting jobs it admits now; a job admitted at a simulated moment starts then and ends its own expected duration
later. Expected durations are the caller's: a job's deadline (``active_deadline_seconds``, basis "deadlines"),
or how long similar recent jobs ran (basis "history"). Jobs submitted later are not foreseen.

An estimate's basis is "history" when the ends the simulation went through before the job started all came from
history (and at least one did), else "deadlines": some job ahead of it was assumed to run to its deadline, so
it will likely start earlier than estimated.

Cost. ``decide`` costs ~20 µs for every job it is given; asking it about every waiting job at every simulated
end would take seconds for a thousand jobs. What keeps a simulation within tens of milliseconds, with the very
result of that plain simulation (``tests/scheduler/test_estimate.py`` compares the two):

- Windows. Inside a group, no job behind the first one that waits for the group's quota or for capacity (the
  job holding the queue) is admitted. So ``decide`` is given, per group, only the jobs that may be admitted:
  the group's jobs in queue order, passing over those their user's quota or a requeue delay holds back (they
  hold no one), up to the first one that surely holds the queue, as it would not fit the group's quota or the
  free capacity even if every earlier one were admitted and all nodes' free resources were pooled. A group
  whose first such job is that one is not asked about at all. The queue is kept as one list per user and
  request, so a user's long run of alike jobs that their quota holds back is passed over in one step.
- Only what changed. A group is looked at again when one of its jobs ended, a requeue delay of its ran out, or
  capacity was freed while capacity may be what holds it.
- Merging. Ends are handled on a grid that coarsens with distance: 1 minute within the next hour, 5 minutes up
  to 6 hours, 15 minutes up to a day, 1 hour beyond; the ends of one cell are handled together, at its end.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import NamedTuple

from jobs.rules import RESOURCES, QuotaLimits

from .core import ArrayState, GroupState, Outcome, QueuedJob, Reason, ReplicaPlacement, Resources, Verdict, decide
from .values import Node

DEADLINES = "deadlines"
HISTORY = "history"
HORIZON = timedelta(days=30)
DEFAULT_DURATION = (86400.0, DEADLINES)  # a job the caller gave no duration for: the default deadline
# (how far ahead, in seconds; grid step within that distance)
RESOLUTION = ((3600, 60), (6 * 3600, 300), (86400, 900), (float("inf"), 3600))
SOON = timedelta(seconds=60)  # a terminating job, one being preempted, or one past its expected end: ends about now


class Estimate(NamedTuple):
    start: datetime
    basis: str  # DEADLINES or HISTORY


@dataclass(frozen=True)
class HeldJob:
    """A job holding resources now: what it holds, where, and since when."""

    id: int
    group_id: int
    user_id: int
    replicas: int
    request: Resources  # per replica
    admitted_at: datetime
    placement: tuple[ReplicaPlacement, ...] = ()
    terminating: bool = False  # being stopped: ends about now, whatever its duration
    array_id: int | None = None  # a member of this array


def step_time(now: datetime, t: datetime) -> datetime:
    """The simulated moment an event at ``t`` is handled: ``t`` rounded up to the grid cell it falls in (a grid
    aligned on the hour of ``now``, finer near ``now``). Never earlier than ``t``."""
    ahead = (t - now).total_seconds()
    step = next(res for limit, res in RESOLUTION if ahead <= limit)
    base = now.replace(minute=0, second=0, microsecond=0)
    cells = -(-(t - base) // timedelta(seconds=step))  # ceiling division of timedeltas
    return base + cells * timedelta(seconds=step)


@dataclass
class _Running:
    """A job the simulation lets end: its owner, what it holds and the basis of its expected end."""

    group_id: int
    user_id: int
    total: dict[str, int]
    request: Resources
    placement: tuple[ReplicaPlacement, ...]
    basis: str | None  # None: its end is known (terminating), it says nothing of deadlines or history
    array_id: int | None = None


class _Simulation:
    def __init__(self, groups: Mapping[int, GroupState], nodes: list[Node], durations: Mapping[int, tuple[float, str]],
                 now: datetime, horizon: timedelta, arrays: Mapping[int, ArrayState] | None = None):
        self.now = now
        self.until = now + horizon
        self.durations = durations
        self.groups = {
            gid: GroupState(g.id, g.name, g.quotas, dict(g.usage), {u: dict(v) for u, v in g.user_usage.items()},
                            g.queue_stopped)
            for gid, g in groups.items()
        }
        # Which GPUs a job gets does not change whether it fits (counts do): the simulation keeps no GPU ids, which
        # spares decide() handing them out.
        self.nodes = [Node(n.name, dict(n.allocatable), dict(n.free), None) for n in nodes]
        self.by_name = {n.name: n for n in self.nodes}
        # Resources every node limits: only for those is "more than all nodes have free" a sure miss.
        self.limited = [r for r in RESOURCES if self.nodes and all(r in n.free for n in self.nodes)]
        self.ends: dict[datetime, list[_Running]] = {}
        self.wakeups: dict[datetime, set[int]] = {}
        self.times: list[datetime] = []
        # Each group's queue as one list per user and request, each in queue order: a user's many alike jobs
        # that their quota holds back are passed over at once.
        self.queues: dict[int, dict[tuple, list[QueuedJob]]] = {}
        self.waiting = 0
        self.order: dict[int, tuple] = {}  # each waiting job's place in queue order
        self.totals: dict[int, dict[str, int]] = {}
        self.capacity_held: set[int] = set()  # groups whose queue free capacity may be holding
        self.started: dict[int, Estimate] = {}
        # Arrays with a %K limit: how many of their members may hold resources, and how many do in the simulation
        # (the held jobs are counted as they are added, so what ends is taken off).
        self.array_limit = {a.id: a.max_running for a in (arrays or {}).values()}
        self.array_holding = dict.fromkeys(self.array_limit, 0)
        self.seen_history = self.seen_deadlines = False
        self.capacity()

    # --- events -----------------------------------------------------------------------------------------------

    def _at(self, t: datetime) -> datetime:
        t = step_time(self.now, t)
        if t not in self.ends and t not in self.wakeups:
            heapq.heappush(self.times, t)
        return t

    def end_at(self, t: datetime, job: _Running) -> None:
        """``job`` ends at ``t``; one that should have ended already ends about now."""
        self.ends.setdefault(self._at(self.now + SOON if t <= self.now else t), []).append(job)

    def wake_at(self, t: datetime, group_id: int) -> None:
        self.wakeups.setdefault(self._at(t), set()).add(group_id)

    def total(self, job: QueuedJob) -> dict[str, int]:
        total = self.totals.get(job.id)
        if total is None:  # only for the jobs a window reaches: most of a long queue never is
            total = self.totals[job.id] = job.total
        return total

    def duration(self, job_id: int) -> tuple[float, str]:
        seconds, basis = self.durations.get(job_id, DEFAULT_DURATION)
        return max(float(seconds), 1.0), basis

    # --- resources --------------------------------------------------------------------------------------------

    def capacity(self) -> None:
        """What all nodes have free (sum, and the most on one node) of every resource they all limit."""
        self.cap_sum = {r: sum(max(n.free[r], 0) for n in self.nodes) for r in self.limited}
        self.cap_max = {r: max(max(n.free[r], 0) for n in self.nodes) for r in self.limited}

    def charge(self, job: _Running, sign: int) -> None:
        """Charge (``sign`` 1) or release (-1) what ``job`` holds: its group's and user's usage, its nodes, its
        array's count."""
        if job.array_id in self.array_limit:
            self.array_holding[job.array_id] += sign
        group = self.groups[job.group_id]
        user = group.user_usage.setdefault(job.user_id, {})
        for r in RESOURCES:
            group.usage[r] = group.usage.get(r, 0) + sign * job.total[r]
            user[r] = user.get(r, 0) + sign * job.total[r]
        for p in job.placement:
            node = self.by_name.get(p.node)
            if node is None:
                continue
            for r in node.free:
                node.free[r] = min(node.free[r] - sign * job.request.get(r, 0), node.allocatable.get(r, 0))

    # --- who may be admitted ----------------------------------------------------------------------------------

    def user_blocked(self, total: Mapping[str, int], used: Mapping[str, int],
                     quotas: Mapping[str, QuotaLimits]) -> bool:
        for r in RESOURCES:
            limit = quotas[r].user_quota if r in quotas else None
            if limit is not None and total[r] > 0 and used.get(r, 0) + total[r] > limit:
                return True
        return False

    def window(self, group_id: int, t: datetime) -> tuple[list[tuple[QueuedJob, tuple, int]], bool]:
        """The jobs of a group that ``decide`` may admit at ``t``, each with where it is in the group's queues: its
        eligible jobs (not held back by their user's quota or a requeue delay: those hold no one) in queue order,
        up to the first one that surely holds the queue, as it cannot fit the group's quota or the free capacity
        even if every earlier one were admitted and all nodes' free resources were pooled. Every job behind that
        one is blocked, and it is itself held, so neither is worth asking ``decide`` about. The flag: whether
        that job is held by capacity (else by the group's quota, or the queue has no such job)."""
        group = self.groups[group_id]
        queues = self.queues[group_id]
        usage = dict(group.usage)
        users: dict[int, dict[str, int]] = {}
        members: dict[int, int] = {}  # per array with a limit, members holding or taken into this window
        cap = dict(self.cap_sum)
        window: list[tuple[QueuedJob, tuple, int]] = []
        order = self.order
        heads = [(order[queue[0].id], key, 0) for key, queue in queues.items() if queue]
        heapq.heapify(heads)
        while heads:
            _, key, i = heapq.heappop(heads)
            queue = queues[key]
            job = queue[i]
            if job.not_before and job.not_before > t:
                if i + 1 < len(queue):
                    heapq.heappush(heads, (order[queue[i + 1].id], key, i + 1))
                continue
            total = self.total(job)
            used = users.get(job.user_id)
            if used is None:
                used = users[job.user_id] = dict(group.user_usage.get(job.user_id, {}))
            if self.user_blocked(total, used, group.quotas):
                continue  # and so is every job behind it of the same user and shape: drop that list
            if job.array_id in self.array_limit:
                taken = members.setdefault(job.array_id, self.array_holding[job.array_id])
                if taken >= self.array_limit[job.array_id]:
                    continue  # so is the rest of that list (one array's): held by its %K, holding no one
                members[job.array_id] = taken + 1
            if not all(
                total[r] == 0 or (q := group.quotas.get(r)) is None or (c := q.ceiling(job.preemptible)) is None
                or usage.get(r, 0) + total[r] <= c
                for r in RESOURCES
            ):
                return window, False
            if not all(total[r] <= cap[r] and job.request.get(r, 0) <= self.cap_max[r] for r in self.limited):
                return window, True
            window.append((job, key, i))
            for r in RESOURCES:
                usage[r] = usage.get(r, 0) + total[r]
                used[r] = used.get(r, 0) + total[r]
            for r in self.limited:
                cap[r] -= total[r]
            if i + 1 < len(queue):
                heapq.heappush(heads, (order[queue[i + 1].id], key, i + 1))
        return window, False

    # --- one simulated moment ---------------------------------------------------------------------------------

    def basis(self) -> str:
        return HISTORY if self.seen_history and not self.seen_deadlines else DEADLINES

    def admit(self, outcome: Outcome, job: QueuedJob, t: datetime) -> None:
        self.started[job.id] = Estimate(t, self.basis())
        seconds, basis = self.duration(job.id)
        running = _Running(job.group_id, job.user_id, self.total(job), job.request, outcome.placement, basis,
                           job.array_id)
        self.charge(running, +1)
        self.end_at(t + timedelta(seconds=seconds), running)

    def step(self, t: datetime, dirty: Iterable[int]) -> None:
        """Ask ``decide`` about the jobs of the groups in ``dirty`` that may be admitted at ``t``; admit what it
        admits."""
        windows: dict[int, list[tuple[QueuedJob, tuple, int]]] = {}
        for gid in dirty:
            if gid not in self.queues:
                continue
            window, by_capacity = self.window(gid, t)
            if by_capacity:
                self.capacity_held.add(gid)
            else:
                self.capacity_held.discard(gid)
            if window:
                windows[gid] = window
        if not windows:
            return
        jobs = [job for window in windows.values() for job, _, _ in window]
        outcomes = decide({gid: self.groups[gid] for gid in windows}, jobs, self.nodes, (), now=t,
                          arrays={a: ArrayState(a, m, self.array_holding[a]) for a, m in self.array_limit.items()})
        admitted = {o.job_id: o for o in outcomes if o.verdict == Verdict.ADMIT}
        for gid, window in windows.items():
            gone: list[tuple[tuple, int]] = []
            for job, key, i in window:  # in queue order: decide() handed out the first free GPUs first
                if job.id in admitted:
                    self.admit(admitted[job.id], job, t)
                    gone.append((key, i))
                else:  # it fit the pooled capacity but found no node with room: capacity holds the group
                    self.capacity_held.add(gid)
            for key, i in sorted(gone, reverse=True):
                del self.queues[gid][key][i]
            self.waiting -= len(gone)
        if admitted:
            self.capacity()

    def run(self, queued: list[QueuedJob]) -> None:
        self.order = {job.id: job.order_key for job in queued}
        for job in sorted(queued, key=lambda j: self.order[j.id]):
            # Same user, same request (and same array: its %K holds the rest of its list, not another's).
            shape = (job.user_id, job.replicas, tuple(job.request.items()), job.array_id)
            self.queues.setdefault(job.group_id, {}).setdefault(shape, []).append(job)
            if job.not_before and job.not_before > self.now:
                self.wake_at(job.not_before, job.group_id)
        self.waiting = len(queued)
        self.capacity_held = set(self.queues)  # not looked at yet
        while self.times and self.waiting:
            t = heapq.heappop(self.times)
            if t > self.until:
                break
            dirty = self.wakeups.pop(t, set())
            ends = self.ends.pop(t, [])
            for job in ends:
                self.charge(job, -1)
                dirty.add(job.group_id)
                self.seen_history |= job.basis == HISTORY
                self.seen_deadlines |= job.basis == DEADLINES
            if ends and self.nodes:  # capacity freed: the groups it may be holding may now fit
                self.capacity()
                dirty |= self.capacity_held
            self.step(t, sorted(dirty))


def estimate(
    groups: Mapping[int, GroupState],
    queued: Iterable[QueuedJob],
    nodes: list[Node],
    holding: Iterable[HeldJob],
    durations: Mapping[int, tuple[float, str]],
    now: datetime,
    *,
    outcomes: Iterable[Outcome] | None = None,
    horizon: timedelta = HORIZON,
    arrays: Mapping[int, ArrayState] | None = None,
) -> dict[int, Estimate | None]:
    """The estimated start of every queued job: ``Estimate(start, basis)``, or None when it is inadmissible or
    does not start within ``horizon``.

    ``groups`` and ``nodes`` are the snapshot ``decide`` gets (usage and free capacity now); ``holding`` every job
    holding resources; ``durations`` job id → (expected seconds, basis) for the holding and the queued jobs.
    ``outcomes``: what ``decide`` already said about these jobs at ``now`` (the pass's decision, preemptions
    included): its admissions start now, its victims end about now. Without them, ``decide`` is asked here,
    without preemption. ``arrays``: the arrays with a ``%K`` limit (``decide``'s); a member waits while its array
    has that many holding resources. Mutates nothing it is given.
    """
    queued = list(queued)
    outcomes = list(decide(groups, queued, nodes, (), now=now, arrays=arrays) if outcomes is None else outcomes)
    by_id = {j.id: j for j in queued}
    decided = {o.job_id: o for o in outcomes if o.job_id in by_id}
    victims = {o.job_id for o in outcomes if o.verdict == Verdict.PREEMPT}

    sim = _Simulation(groups, nodes, durations, now, horizon, arrays)
    for h in holding:
        seconds, basis = sim.duration(h.id)
        soon = h.terminating or h.id in victims  # being stopped: ends about now, whatever its duration
        running = _Running(h.group_id, h.user_id, {r: h.request.get(r, 0) * h.replicas for r in RESOURCES},
                           h.request, h.placement, None if soon else basis, h.array_id)
        if h.array_id in sim.array_limit:  # held already (the snapshot's usage has it): counted, not charged
            sim.array_holding[h.array_id] += 1
        sim.end_at(now if soon else h.admitted_at + timedelta(seconds=seconds), running)
    waiting = []
    for job in queued:
        outcome = decided.get(job.id)
        if outcome is None or outcome.verdict == Verdict.INADMISSIBLE:
            continue
        if outcome.verdict == Verdict.ADMIT:
            sim.admit(outcome, job, now)
        elif outcome.reason == Reason.PREEMPTING:  # the next passes decide it first, on what its victims free
            waiting.append(replace(job, nominated=True))
        else:
            waiting.append(job)
    sim.capacity()
    sim.run(waiting)
    return {j.id: sim.started.get(j.id) for j in queued}
