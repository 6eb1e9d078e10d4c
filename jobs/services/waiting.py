"""What waiting jobs show, written in bulk by each scheduling pass: their wait message, the reason and message of
the jobs behind the head of their group's queue, and when they are expected to start. None of it is a status change
(no event); each write is one statement however long the queue, and the changed jobs are published after commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Case, Q, TextField, Value, When
from django.utils import timezone

from ..choices import Phase
from ..models import Job
from ..prepared import Prepared, in_parts


def job_queue_info_update(updates: dict[int, str]) -> None:
    """Refresh the wait message of pending jobs whose phase and reason are unchanged ({job id: message}).

    Not a status change (no event): one bulk write per scheduling pass, however long the queue. Queue positions
    are not stored: they are derived where they are read (``selectors.queue_positions``).
    """
    _bulk_update({pk: (message,) for pk, message in updates.items()}, ["message"])


BLOCKED_REASON = "BlockedByQueueHead"


def job_queue_behind_update(*, behind: dict[int, str], jobs: Iterable[int] = (), groups: Iterable[int] = ()) -> None:
    """Pending jobs that wait behind the head of their group's queue: reason BlockedByQueueHead and the message of
    their group in ``behind`` ({group id: message}, which names the head). For ``jobs`` (pending jobs the pass
    decided so) and for every job already waiting behind a head in ``groups`` (whose head changed).

    Not an event per job: a job behind the head was not looked at, only its head was. One UPDATE for all of them
    (none where nothing changed), published after commit.
    """
    jobs, groups = list(jobs), [g for g in groups if g in behind]
    if not jobs and not groups:
        return
    if connection.vendor == "postgresql":  # the groups' messages as a VALUES list: no CASE of a thousand arms
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Job._meta.db_table} AS j SET reason = %s, message = v.message, updated_at = %s FROM (VALUES "
                + ", ".join(["(%s::bigint, %s::text)"] * len(behind)) + ") AS v(group_id, message) "
                "WHERE j.group_id = v.group_id AND j.phase = %s AND (j.id = ANY(%s) OR (j.group_id = ANY(%s) "
                "AND j.reason = %s)) AND NOT (j.reason = %s AND j.message = v.message) RETURNING j.id",
                [BLOCKED_REASON, timezone.now(), *(x for item in behind.items() for x in item), Phase.PENDING, jobs,
                 groups, BLOCKED_REASON, BLOCKED_REASON])
            changed = [row[0] for row in cursor.fetchall()]
    else:
        message = Case(*[When(group_id=g, then=Value(m)) for g, m in behind.items()], output_field=TextField())
        rows = (Job.objects.filter(phase=Phase.PENDING)
                .filter(Q(pk__in=jobs) | Q(group_id__in=groups, reason=BLOCKED_REASON))
                .filter(group_id__in=list(behind))
                .exclude(reason=BLOCKED_REASON, message=message))
        changed = list(rows.values_list("pk", flat=True))
        Job.objects.filter(pk__in=changed).update(reason=BLOCKED_REASON, message=message, updated_at=timezone.now())
    if not changed:
        return
    from ..live_publisher import publish_job_changes

    transaction.on_commit(lambda: publish_job_changes(changed), robust=True)


# Which of some jobs are still pending, their rows locked (compiled once for each number of jobs, up to 64).
STILL_PENDING = Prepared(lambda ids: Job.objects.select_for_update().filter(pk__in=ids, phase=Phase.PENDING)
                         .values_list("pk", flat=True), ids=list)


def job_estimate_update(updates: dict[int, tuple[datetime | None, str]]) -> None:
    """Record when pending jobs are expected to start, and on what basis ("deadlines" or "history"; a None start:
    not within the scheduler's horizon). The scheduling pass passes only the estimates that changed.

    Not a status change (no event): one bulk write per scheduling pass, however long the queue. Written after the
    pass has committed, so only jobs still pending (their rows locked for the write) take their estimate.
    """
    if not updates:
        return
    with transaction.atomic():
        pending = in_parts(updates, lambda part: STILL_PENDING.all(ids=part))
        _bulk_update({pk: updates[pk] for pk in pending}, ["estimated_start", "estimate_basis"])


def _bulk_update(rows: dict[int, tuple], fields: list[str]) -> None:
    """Write ``fields`` of many jobs at once ({job id: their values}) and publish them after commit (one query,
    one small message each)."""
    if not rows:
        return
    if connection.vendor in ("postgresql", "sqlite"):
        update_from_values(rows, fields, connection)
    else:
        Job.objects.bulk_update([Job(pk=pk, **dict(zip(fields, values, strict=True))) for pk, values in rows.items()],
                                fields, batch_size=1000)
    from ..live_publisher import publish_job_changes

    changed = list(rows)
    transaction.on_commit(lambda: publish_job_changes(changed), robust=True)


def update_from_values(rows: dict[int, tuple], fields: list[str], db: BaseDatabaseWrapper, batch: int = 5000) -> None:
    """PostgreSQL and SQLite: ``UPDATE … FROM (VALUES …)`` of ``fields`` ({job id: their values}, no model
    instance built), one statement per ``batch`` jobs (Django's ``bulk_update`` builds a CASE per field and row:
    seconds of Python for thousands of rows, and most of a small update's CPU). SQLite names the columns of VALUES
    column1, column2, … and has no casts to need."""
    columns = [Job._meta.get_field(f) for f in fields]
    if db.vendor == "postgresql":
        row = "(%s::bigint, " + ", ".join(f"%s::{c.db_type(db)}" for c in columns) + ")"
        names = ["id", *(c.column for c in columns)]
        source = f"v({', '.join(names)})"
    else:
        row = "(" + ", ".join(["%s"] * (len(columns) + 1)) + ")"
        names = [f"column{n}" for n in range(1, len(columns) + 2)]
        source = "v"
        batch = min(batch, db.features.max_query_params // len(names))
    sets = ", ".join(f"{c.column} = v.{name}" for c, name in zip(columns, names[1:], strict=True))
    items = list(rows.items())
    with db.cursor() as cursor:
        for start in range(0, len(items), batch):
            chunk = items[start:start + batch]
            params: list[Any] = []
            for pk, values in chunk:
                params.append(pk)
                params.extend(c.get_db_prep_save(v, db) for c, v in zip(columns, values, strict=True))
            cursor.execute(f"UPDATE {Job._meta.db_table} AS j SET {sets} FROM (VALUES {', '.join([row] * len(chunk))}) "
                           f"AS {source} WHERE j.id = v.{names[0]}", params)
