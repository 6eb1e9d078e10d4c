"""How long jobs run: what the estimates expect of a waiting job, read from the attempts that ended recently.

From the most like a job to the least: the same user, group and job name; the same user, group and instance type;
the group and instance type; the instance type anywhere on the site; the group with any instance type. The first
of these with ``HISTORY_MIN_SAMPLES`` runs gives the median of its last ``HISTORY_SAMPLES``; when none has that
many, the first with any run at all does (a site whose 30-second jobs have run once does not expect the next one to
run for its whole day-long deadline); when nothing like it has run, its deadline ("deadlines": the latest it can
end). Never more than the job's deadline.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import DurationField, ExpressionWrapper, F

from .models import Attempt

# Attempts the scheduler ended (evicted, requeued, lost with their node) say nothing of how long a job runs.
NOT_RUN_LENGTHS = ("Preempted", "Requeued", "NodeLost", "NodeUnresponsive", "RequeueLimitExceeded")
HISTORY_SAMPLES = 20  # the most recent ended attempts per kind of job
HISTORY_MIN_SAMPLES = 3  # fewer say less: used only when no kind of job like it has as many
HISTORY_SCAN = 5000  # the newest ended attempts looked at, whatever the size of the history
LEVELS = ("by_name", "by_user_type", "by_group_type", "by_type", "by_group")


@dataclass
class DurationHistory:
    """How long recent similar jobs ran (median seconds), by (user, group, job name), (user, group, instance type),
    (group, instance type), instance type and group: those with enough runs, and in ``few`` (level, key) those
    with fewer."""

    by_name: dict[tuple[int, int, str], float]
    by_user_type: dict[tuple[int, int, int], float]
    by_group_type: dict[tuple[int, int], float]
    by_type: dict[int, float] = field(default_factory=dict)
    by_group: dict[int, float] = field(default_factory=dict)
    few: dict[tuple[str, object], float] = field(default_factory=dict)

    def expected(self, *, user_id: int, group_id: int, name: str, instance_type_id: int,
                 deadline: float) -> tuple[float, str]:
        """The expected run time of a job and its basis: the median of the most similar recent jobs (never more than
        its deadline), "history"; else its deadline, "deadlines"."""
        keys = kinds_of(user_id, group_id, name, instance_type_id)
        found = next((getattr(self, level)[key] for level, key in zip(LEVELS, keys, strict=True)
                      if key in getattr(self, level)), None)
        if found is None:
            found = next((self.few[(level, key)] for level, key in zip(LEVELS, keys, strict=True)
                          if (level, key) in self.few), None)
        if found is None:
            return float(deadline), "deadlines"
        return min(found, float(deadline)), "history"


def kinds_of(user_id: int, group_id: int, name: str, type_id: int) -> tuple:
    """The key of a job at each of LEVELS, most like it first."""
    return (user_id, group_id, name), (user_id, group_id, type_id), (group_id, type_id), type_id, group_id


def history_from_runs(runs: dict[tuple[str, object], list[float]],
                      min_samples: int = HISTORY_MIN_SAMPLES) -> DurationHistory:
    """The history of run times per (level, key), newest kept (the replay benchmark keeps them in memory)."""
    history = DurationHistory({}, {}, {})
    for (level, key), found in runs.items():
        if not found:
            continue
        if len(found) >= min_samples:
            getattr(history, level)[key] = statistics.median(found)
        else:
            history.few[(level, key)] = statistics.median(found)
    return history


def job_duration_history(*, since: datetime, samples: int = HISTORY_SAMPLES, min_samples: int = HISTORY_MIN_SAMPLES,
                         scan: int = HISTORY_SCAN) -> DurationHistory:
    """The median run time (start to end) of the last ``samples`` attempts of each kind of job (the module's
    levels), among the newest ``scan`` attempts that ended since ``since`` (newest first).

    One query, bounded whatever the size of the history: a backward scan of the attempts' primary key that stops
    after ``scan`` rows, each with its job's user, group, name and instance type, and the run time."""
    rows = (
        Attempt.objects.filter(ended_at__gte=since, started_at__isnull=False)
        .exclude(outcome__in=NOT_RUN_LENGTHS)
        .order_by("-id")
        .annotate(run=ExpressionWrapper(F("ended_at") - F("started_at"), output_field=DurationField()))
        .values_list("job__user_id", "job__group_id", "job__name", "job__instance_type_id", "run")[:scan]
    )
    runs: dict[tuple[str, object], list[float]] = defaultdict(list)
    for user_id, group_id, name, type_id, run in rows:  # newest first
        seconds = max(run.total_seconds(), 0.0)
        for level, key in zip(LEVELS, kinds_of(user_id, group_id, name, type_id), strict=True):
            found = runs[(level, key)]
            if len(found) < samples:
                found.append(seconds)
    return history_from_runs(runs, min_samples)
