"""The estimated start times a pass writes for the jobs it leaves waiting, and what it keeps between passes for them.

``EstimateMemory`` is that state: the duration history of similar recent jobs (read at most once a minute of the
pass clock) and what the last estimates were made of (so a steady pass skips the simulation). One lives as long as
the scheduler process (``memory``); ``estimate_memory_reset`` forgets it (tests, between databases).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta

from jobs.choices import Phase
from jobs.durations import DurationHistory, job_duration_history

from .core import Outcome, Reason
from .estimate import estimate
from .snapshot import Snapshot

log = logging.getLogger(__name__)

HISTORY_SPAN = timedelta(days=30)  # how far back similar jobs' run times are looked for
HISTORY_TTL = timedelta(seconds=60)  # how long the scheduler reuses them
ESTIMATE_SLACK = timedelta(seconds=60)  # an estimate that moved less is not written again
# The least time between two simulations while what they are made of keeps changing: profiled under 300 jobs
# through 8 GPUs (a pass a job), the simulation was the largest single part of the scheduler's CPU (13 %).
ESTIMATE_GAP = timedelta(seconds=1)


class EstimateMemory:
    """What the estimates of one scheduler process keep from pass to pass."""

    def __init__(self) -> None:
        self.history: tuple[datetime, DurationHistory] | None = None  # read at, what was read
        self.made_of: tuple[int, datetime] | None = None  # what the last estimates were made of, and their pass clock
        self.seen: tuple[tuple, int] | None = None  # the last pass's snapshot, outcomes and history, and their hash

    def forget(self) -> None:
        self.history = self.made_of = self.seen = None

    def duration_history(self, now: datetime) -> DurationHistory:
        """How long similar recent jobs ran: read at most once a minute of the pass clock (one query)."""
        if self.history is None or not timedelta(0) <= now - self.history[0] < HISTORY_TTL:
            self.history = (now, job_duration_history(since=now - HISTORY_SPAN))
        return self.history[1]

    def estimate_due(self, snap: Snapshot, outcomes: list[Outcome], history: DurationHistory, now: datetime) -> bool:
        """Whether to estimate the waiting jobs' starts again: something they are made of changed since the last
        estimates (the decision, the jobs holding resources, the nodes, the quotas, the history, the estimates
        shown) and those are at least ``ESTIMATE_GAP`` old, or ``ESTIMATE_SLACK`` has passed (until then an
        estimate moves less than what is written). A steady pass over a long queue skips the simulation, and one
        that reuses the last decision (``scheduler.carry``: the same objects) does not even hash them again. While
        the queue churns (a pass a job), the simulation runs at most once per ``ESTIMATE_GAP`` of the pass clock; a
        change it skipped is estimated by the first pass after the gap (at the latest the next timed pass)."""
        made_from = (snap, outcomes, history)
        if self.seen and all(a is b for a, b in zip(made_from, self.seen[0], strict=True)):
            made_of = self.seen[1]
        else:
            made_of = self._made_of(snap, outcomes, history)
            self.seen = (made_from, made_of)
        last = self.made_of
        if last and timedelta(0) <= now - last[1] < (ESTIMATE_SLACK if last[0] == made_of else ESTIMATE_GAP):
            return False
        self.made_of = (made_of, now)
        return True

    @staticmethod
    def _made_of(snap: Snapshot, outcomes: list[Outcome], history: DurationHistory) -> int:
        return hash((
            tuple((o.job_id, o.verdict, o.reason) for o in outcomes),
            tuple((h.id, h.terminating) for h in snap.holding),
            tuple((n.name, tuple(sorted(n.free.items()))) for n in snap.nodes),
            tuple((gid, g.queue_stopped, tuple(sorted(g.quotas.items()))) for gid, g in sorted(snap.groups.items())),
            tuple(sorted(snap.estimates.items())),
            id(history),
        ))


memory = EstimateMemory()  # this process's


def estimate_memory_reset() -> None:
    """Forget the duration history and what the last estimates were made of: the next pass reads and estimates
    again (a test on a fresh database)."""
    memory.forget()


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


def estimate_changes(snap: Snapshot, outcomes: list[Outcome], history: DurationHistory, now: datetime,
                     waiting: list[int]) -> dict[int, tuple[datetime | None, str]]:
    """The estimated start of each job left waiting by this pass, where it differs from what the job shows (by
    more than a minute, or in its basis): {job id: (start or None, basis or "")}."""
    durations = {
        job_id: history.expected(user_id=user, group_id=group, name=name, instance_type_id=itype, deadline=deadline)
        for job_id, (user, group, name, itype, deadline) in snap.kinds.items()
    }
    try:
        estimates = estimate(snap.groups, snap.queued, snap.nodes, snap.holding, durations, now, outcomes=outcomes,
                             arrays=snap.arrays)
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

