"""What a scheduling pass carries to the next: its decision, reused while nothing the decision reads has changed.

A steady pass (nothing submitted, ended, cancelled, requeued or edited since the last one) would read the same rows
and decide the same as the last pass, and write nothing, as that one did: the jobs that wait for their own
preemption victims to end, for their user's quota, for their group's quota or for capacity are all decided the
same way again. So each pass first reads, in one query, a fingerprint of every row its decision reads (each row's
id and version, ``xmin`` and ``ctid``: any UPDATE gives a row a new ``ctid``, even a second one in the same
transaction; an INSERT or DELETE changes the set): the groups and their quotas, the recorded nodes, the jobs holding
resources with their current attempts, the queued jobs a pass reads (the same querysets ``scheduler.snapshot`` reads,
and each group's first jobs behind its head, as many as the last pass read) and their arrays. When the fingerprint
is the last pass's, that pass wrote nothing, and the pass clock crosses no queued job's requeue delay, the pass
reuses the last snapshot and decision: no row read again, nothing decided again, nothing to write.

A held job is therefore decided again exactly when something that holds it changes: its user's usage or its group's
(a job of theirs ends or is admitted: its row changes), its group's quota (a quota row), the nodes (a node row, or a
job holding resources on them), a victim that ended (its row), the clock passing its requeue delay; and so is every
other job, because any change makes the next pass a fresh one. PostgreSQL only; elsewhere every pass is fresh.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from django.db import connection
from django.db.models.expressions import RawSQL

from jobs.choices import RESOURCE_PHASES
from jobs.models import Attempt, Group, GroupQuota, Job, JobArray
from jobs.models import Node as NodeRow

from .core import Outcome
from .snapshot import HEAD_ROWS, HEADS_PARAMS, Snapshot, heads_sql, queued_read_whole

Key = tuple  # (database, backend, head rows per group, fingerprint)


def _version(alias: str) -> str:
    return f"{alias}.id::text || ':' || {alias}.xmin::text || {alias}.ctid::text"


def _digest(expression: str, source: str, order: str = "r.id") -> str:
    return f"(SELECT md5(string_agg({expression}, ',' ORDER BY {order})) FROM {source})"


def fingerprint(backend_name: str, head_rows: Mapping[int, int]) -> tuple:
    """One query: a digest of the versions of every row a pass's decision reads (``head_rows``: each group's first
    jobs behind its head read, where not ``HEAD_ROWS``)."""
    job, attempt = Job._meta.db_table, Attempt._meta.db_table
    stopped = Group.objects.filter(queue_stopped=True).values("id")
    parts, params = [], []
    version = RawSQL(_version(connection.ops.quote_name(job)), ())
    for queryset in queued_read_whole(stopped):
        sql, p = queryset.order_by().annotate(v=version).values_list("id", "array_id", "v").query.sql_with_params()
        parts.append(sql)
        params.extend(p)
    # Each group's first jobs behind its head, as many as the last pass read (HEAD_ROWS where it read no more).
    parts.append(
        f"SELECT h.* FROM (SELECT g.id, coalesce(l.n, %s) AS n FROM {Group._meta.db_table} g "
        f"LEFT JOIN unnest(%s::bigint[], %s::int[]) AS l(id, n) ON l.id = g.id WHERE NOT g.queue_stopped) g "
        f"CROSS JOIN LATERAL " + heads_sql(f"j.id, j.array_id, {_version('j')}", "g.n"))
    params.extend([HEAD_ROWS, list(head_rows), list(head_rows.values()), *HEADS_PARAMS])
    phases = sorted(RESOURCE_PHASES)
    holding = (f"{job} j LEFT JOIN {attempt} a ON a.id = j.current_attempt_id "
               f"WHERE j.phase IN ({', '.join(['%s'] * len(phases))})")
    sql = (
        f"WITH q(id, array_id, v) AS ({' UNION '.join(f'({part})' for part in parts)}) SELECT "
        + ", ".join([
            "(SELECT md5(string_agg(v, ',' ORDER BY id)) FROM q)",
            _digest(_version("r"), f"{JobArray._meta.db_table} r WHERE r.id IN (SELECT array_id FROM q)"),
            _digest(_version("r"), f"{Group._meta.db_table} r"),
            _digest(_version("r"), f"{GroupQuota._meta.db_table} r"),
            _digest(_version("r"), f"{NodeRow._meta.db_table} r WHERE r.backend = %s"),
            _digest(f"{_version('j')} || ':' || coalesce(a.xmin::text || a.ctid::text, '')", holding, "j.id"),
        ])
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, backend_name, *phases])
        return tuple(cursor.fetchone())


@dataclass
class Carried:
    """A pass's decision, kept for the next pass."""

    key: Key | None  # what it was made of; None: not to be reused (the pass wrote, or read other rows than keyed)
    head_rows: dict[int, int]  # each group's jobs behind its head it read, where not HEAD_ROWS
    snap: Snapshot
    outcomes: list[Outcome]
    waiting: list[int]
    result: object  # the pass's PassResult
    clock: datetime
    delays: tuple[datetime, ...]  # the queued jobs' requeue delays
    estimated: tuple | None = None  # estimated_part(snap, outcomes, waiting), once made

    def same_clock(self, now: datetime) -> bool:
        """Whether every requeue delay is on the same side of ``now`` as of the clock it was decided at."""
        return all((d > now) == (d > self.clock) for d in self.delays)


def _head_rows(snap: Snapshot) -> dict[int, int]:
    return {gid: n for gid, (n, _) in snap.prefix.items() if n != HEAD_ROWS}


class PassMemory:
    """The last pass's decision, and the fingerprint the current pass read (this process's; passes take turns
    under the scheduling lock)."""

    def __init__(self) -> None:
        self.last: Carried | None = None
        self.key: Key | None = None  # the current pass's fingerprint, read by ``recall``
        self.lock = threading.Lock()

    def forget(self) -> None:
        with self.lock:
            self.last = self.key = None

    def recall(self, backend_name: str, now: datetime) -> Carried | None:
        """Under the scheduling lock, before anything else is read: the last pass's decision if nothing it was made
        of has changed (one query), else None (the pass decides afresh and ``remember``s its decision)."""
        with self.lock:
            self.key = None
            if connection.vendor != "postgresql":
                return None
            head_rows = self.last.head_rows if self.last else {}
            self.key = (connection.alias, str(connection.settings_dict.get("NAME")), backend_name,
                        tuple(sorted(head_rows.items())), fingerprint(backend_name, head_rows))
            last = self.last
            if last is not None and last.key == self.key and last.same_clock(now):
                return last
            return None

    def remember(self, snap: Snapshot, outcomes: list[Outcome], waiting: list[int], result: object, now: datetime,
                 *, wrote: bool) -> Carried:
        """A fresh pass's decision. It may be reused only if the pass wrote nothing and read the rows its
        fingerprint covers (each group's jobs behind its head as many as keyed)."""
        head_rows = _head_rows(snap)
        with self.lock:
            key = self.key
            if wrote or key is None or key[3] != tuple(sorted(head_rows.items())):
                key = None
            self.last = Carried(key, head_rows, snap, outcomes, list(waiting), replace(result), now,
                                tuple(j.not_before for j in snap.queued if j.not_before is not None))
            return self.last


memory = PassMemory()  # this process's


def pass_memory_reset() -> None:
    """Forget the last pass's decision: the next pass decides afresh (tests comparing with a fresh pass)."""
    memory.forget()
