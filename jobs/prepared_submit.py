"""A submit's writes as one statement on PostgreSQL: the new job, its first event and, with an `Idempotency-Key`,
the key (the user's expired keys dropped in passing).

Written one after another they were five round trips to the database (BEGIN, the job, the key, the event, COMMIT),
each costing the web process and PostgreSQL more CPU than the insert itself. As one statement of data-modifying
``WITH`` clauses they are one, and atomic by themselves. With a key, the key goes first and the job takes the id the
key was given (the job's own sequence): when another submit holds the key (the unique constraint decides, waiting
for that submit's commit, as a plain insert would), the key's clause makes no row, so neither the job nor its event
is written, and ``write`` says so.

The values are the ones Django's ``save`` would write (``pre_save``: ``auto_now_add``; ``get_db_prep_save``: JSON),
cast to their columns' types where they come through a ``SELECT``; a value the column refuses (too long) fails the
statement, and nothing of it is written. ``usable`` says when this applies; elsewhere the caller writes them one by
one (``services.submission``), the key with the same SQL (``key_statements``).
"""

from __future__ import annotations

import re
from datetime import datetime

from django.db import connections, router
from django.db.models import NOT_PROVIDED

from .models import Job, JobEvent, SubmitKey
from .prepared_writes import inserted_fields, plain

_sql: dict[tuple, str] = {}


def _event_columns() -> list:
    return [f for f in inserted_fields(JobEvent) if f.name != "job"]  # the job's id comes from the job's clause


def key_statements(connection, *, job_id: str, returning: str) -> tuple[str, str]:
    """The SQL of a submit's `Idempotency-Key`: the user's other expired keys dropped (parameters: the user, the
    expiry, the key), and the key inserted, taking the place of its own expired row if any (parameters: the user,
    the key, the fingerprint, the made time, the expiry; ``job_id``, the SQL of the job's id, may take one more
    after the fingerprint). The insert answers ``returning``, or no row when another submit holds the key."""
    table, key = connection.ops.quote_name(SubmitKey._meta.db_table), connection.ops.quote_name("key")
    delete = f"DELETE FROM {table} WHERE user_id = %s AND created_at < %s AND {key} <> %s"
    upsert = (f"INSERT INTO {table} (user_id, {key}, fingerprint, job_id, created_at) "
              f"VALUES (%s, %s, %s, {job_id}, %s) ON CONFLICT (user_id, {key}) DO UPDATE SET "
              f"fingerprint = EXCLUDED.fingerprint, job_id = EXCLUDED.job_id, created_at = EXCLUDED.created_at "
              f"WHERE {table}.created_at < %s RETURNING {returning}")
    return delete, upsert


def usable() -> bool:
    """PostgreSQL, and Django's ``save`` writes jobs and events plainly (nothing listens to their saves, no field
    needs a placeholder of its own; a submit's values are never expressions)."""
    return (connections[router.db_for_write(Job)].vendor == "postgresql"
            and all(plain(inserted_fields(model), model) for model in (Job, JobEvent)))


def _given(instance, fields, connection) -> tuple[tuple, list]:
    """The fields of ``instance`` to write and their values as Django's ``save`` prepares them, less those that are
    NULL where the column's default is NULL anyway (no ``db_default``): a new job leaves a third of its columns
    empty, and psycopg converts a statement of more than 50 parameters again at each call, without its cache."""
    given = [(f, f.get_db_prep_save(f.pre_save(instance, True), connection)) for f in fields]
    given = [(f, v) for f, v in given if v is not None or f.db_default is not NOT_PROVIDED]
    return tuple(f for f, _ in given), [v for _, v in given]


def _statement(connection, with_key: bool, job_columns: tuple, event_columns: tuple) -> str:
    qn = connection.ops.quote_name
    job_table, job_pk = qn(Job._meta.db_table), qn(Job._meta.pk.column)
    names = ", ".join(qn(f.column) for f in job_columns)

    def cast(fields) -> str:
        # Each value as its column's type less a modifier (varchar, not varchar(60)): an explicit cast to the
        # length would cut a value that is too long, where the column's own assignment refuses it, as in an insert.
        return ", ".join(f"%s::{re.sub(r'[(][^)]*[)]', '', f.cast_db_type(connection))}" for f in fields)

    if with_key:
        delete, upsert = key_statements(
            connection, job_id=f"nextval(pg_get_serial_sequence('{job_table}', '{Job._meta.pk.column}'))",
            returning="job_id")
        sql = (f"WITH expired AS ({delete}), new_key AS ({upsert}), "
               f"new_job AS (INSERT INTO {job_table} ({job_pk}, {names}) SELECT job_id, {cast(job_columns)} "
               f"FROM new_key RETURNING {job_pk}), ")
    else:
        sql = (f"WITH new_job AS (INSERT INTO {job_table} ({names}) VALUES ({', '.join(['%s'] * len(job_columns))}) "
               f"RETURNING {job_pk}), ")
    event_pk = qn(JobEvent._meta.pk.column)
    sql += (f"new_event AS (INSERT INTO {qn(JobEvent._meta.db_table)} ({qn(JobEvent._meta.get_field('job').column)}, "
            f"{', '.join(qn(f.column) for f in event_columns)}) SELECT {job_pk}, {cast(event_columns)} FROM new_job "
            f"RETURNING {event_pk}) "
            f"SELECT new_job.{job_pk}, new_event.{event_pk} FROM new_job, new_event")
    return sql


def write(job: Job, event: JobEvent, *, key: str = "", fingerprint: str = "", now: datetime | None = None,
          expired_before: datetime | None = None) -> bool:
    """Insert ``job`` and ``event`` (of that job), and the key (made ``now``; a row of the same key made before
    ``expired_before`` is taken over, the user's other ones are dropped). False: another submit holds the key and
    nothing was written. On True both have their ids and are saved as Django's ``save`` leaves an instance."""
    db = router.db_for_write(Job)
    connection = connections[db]
    job_columns, job_values = _given(job, inserted_fields(Job), connection)
    event_columns, event_values = _given(event, _event_columns(), connection)
    params = []
    if key:
        at, before = (connection.ops.adapt_datetimefield_value(t) for t in (now, expired_before))
        params += [job.user_id, before, key, job.user_id, key, fingerprint, at, before]
    cache_key = (db, bool(key), job_columns, event_columns)
    sql = _sql.get(cache_key)
    if sql is None:
        sql = _sql[cache_key] = _statement(connection, bool(key), job_columns, event_columns)
    with connection.cursor() as cursor:
        cursor.execute(sql, params + job_values + event_values)
        row = cursor.fetchone()
    if row is None:
        return False
    job.pk, event.pk = row
    event.job = job
    for instance in (job, event):
        instance._state.adding, instance._state.db = False, db
    return True
