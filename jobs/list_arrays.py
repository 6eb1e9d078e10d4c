"""Reading arrays for the pages: the job list shows an array (or sweep) as one row, at its first member's place,
with its members counted per status and a bar in the status colours; an array's page lists its members.

Every read here is permission-aware through ``jobs.selectors``; nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from .choices import TERMINAL_PHASES, Phase
from .models import Job, JobArray
from .state_machine import COLOR_NAMES, color_for

# The order statuses are counted and drawn in: the lifecycle's, waiting first, then running, then ended.
PHASE_ORDER = [Phase.SUBMITTED, Phase.INADMISSIBLE, Phase.PENDING, Phase.BACKOFF, Phase.PREPARING, Phase.RUNNING,
               Phase.TERMINATING, Phase.UNKNOWN, Phase.SUCCEEDED, Phase.FAILED, Phase.TIMED_OUT, Phase.PREEMPTED,
               Phase.CANCELLED]


def collapse_members(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """``jobs`` with each array's members folded into one: jobs of no array, and of each array its first member
    (the lowest id), whose place in the newest-first order the array's row takes. The first member of the whole
    array, not of ``jobs``: a list filtered by phase shows an array when its first member matches, as the live
    updates (keyed by that member) do."""
    earlier = Job.objects.filter(array_id=OuterRef("array_id"), pk__lt=OuterRef("pk"))
    return jobs.filter(Q(array__isnull=True) | ~Exists(earlier))


@dataclass
class StatusCount:
    """How many members are in one status: its label, its colour (the badges' class) and its share of the array."""

    label: str
    n: int
    color_name: str
    pct: float = 0.0


@dataclass
class ArraySummary:
    array: JobArray
    first_id: int  # the member whose place in the list the array's row takes
    counts: list[StatusCount] = field(default_factory=list)  # per status, in the lifecycle's order
    bar: list[StatusCount] = field(default_factory=list)  # per colour, for the bar
    total: int = 0

    @property
    def kind(self) -> str:
        return "sweep" if self.array.sweep else "array"

    @property
    def ended(self) -> int:
        return sum(c.n for c in self.counts if c.label in {Phase(p).label for p in TERMINAL_PHASES})

    @property
    def done(self) -> bool:
        return self.total > 0 and self.ended == self.total

    @property
    def count_text(self) -> str:
        """E.g. "Running 2 · Pending 3" (what the row says, and the bar's label)."""
        return " · ".join(f"{c.label} {c.n}" for c in self.counts)


def summarize(arrays: Iterable[JobArray], first_ids: dict[int, int]) -> dict[int, ArraySummary]:
    """Each array's counts per status and its bar: one query for all of them."""
    arrays = {a.pk: a for a in arrays}
    rows = (Job.objects.filter(array_id__in=list(arrays)).order_by()
            .values("array_id", "phase", "status").annotate(n=Count("id")))
    by_phase: dict[int, dict[str, int]] = {pk: {} for pk in arrays}
    by_color: dict[int, dict[str, int]] = {pk: {} for pk in arrays}
    for row in rows:
        phases, colors = by_phase[row["array_id"]], by_color[row["array_id"]]
        phases[row["phase"]] = phases.get(row["phase"], 0) + row["n"]
        name = COLOR_NAMES[color_for(row["phase"], row["status"] or "")]
        colors[name] = colors.get(name, 0) + row["n"]
    out = {}
    for pk, array in arrays.items():
        total = sum(by_phase[pk].values())
        counts = [StatusCount(Phase(p).label, by_phase[pk][p], COLOR_NAMES[color_for(p, "")])
                  for p in PHASE_ORDER if by_phase[pk].get(p)]
        order = list(dict.fromkeys(c.color_name for c in counts))  # the bar follows the lifecycle's colours
        order += [name for name in by_color[pk] if name not in order]
        bar = [StatusCount(name, by_color[pk][name], name, 100.0 * by_color[pk][name] / total)
               for name in order if by_color[pk].get(name)]
        out[pk] = ArraySummary(array, first_ids.get(pk, 0), counts, bar, total)
    return out


def with_array_rows(jobs: Iterable[Job]) -> list[Job]:
    """``jobs`` (a page of the collapsed list) with ``array_row`` set on each array's member: its array's summary
    (None on jobs of no array). One query for the arrays, one for their counts."""
    jobs = list(jobs)
    members = [j for j in jobs if j.array_id]
    arrays = JobArray.objects.filter(pk__in={j.array_id for j in members}).select_related("group", "user")
    summaries = summarize(arrays, {j.array_id: j.pk for j in members})
    for job in jobs:
        job.array_row = summaries.get(job.array_id) if job.array_id else None
    return jobs


def first_member_ids(array_ids: Iterable[int]) -> dict[int, int]:
    """Array id → the id of its first member (the place of its row)."""
    from django.db.models import Min

    rows = (Job.objects.filter(array_id__in=list(array_ids)).order_by().values("array_id")
            .annotate(first=Min("id")).values_list("array_id", "first"))
    return dict(rows)


def array_rows(array_ids: Iterable[int]) -> dict[int, ArraySummary]:
    """The list rows of these arrays (for a live update): array id → its summary. Three queries."""
    ids = set(array_ids)
    arrays = JobArray.objects.filter(pk__in=ids).select_related("group", "user")
    return summarize(arrays, first_member_ids(ids))


def array_page(array: JobArray) -> dict[str, Any]:
    """An array's page: its summary and its members in index order (queue positions of the waiting ones)."""
    from . import selectors

    members = list(array.members.select_related("group", "user", "instance_type", "current_attempt")
                   .order_by("array_index", "id"))
    selectors.with_queue_positions(members)
    summary = summarize([array], {array.pk: min((m.pk for m in members), default=0)})[array.pk]
    return {"array": array, "summary": summary, "members": members,
            "failed": sum(1 for m in members if m.phase == Phase.FAILED),
            "active": sum(1 for m in members if m.phase not in TERMINAL_PHASES)}
