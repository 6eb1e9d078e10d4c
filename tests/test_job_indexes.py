"""The job table's indexes on PostgreSQL: each lookup still has an index, and no index repeats the leading columns of
another (every index of a row is written by its insert and again by each transition, which changes the indexed
phase: a redundant one costs every submit and every status change, and its space at a million jobs)."""

from __future__ import annotations

import pytest
from django.db import connection

from jobs.models import Job

pytestmark = [pytest.mark.fast, pytest.mark.django_db]


def plan(where: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a near-empty table: show the index it would use
        cursor.execute(f"EXPLAIN SELECT id FROM {Job._meta.db_table} WHERE {where} = 1")
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.fixture(autouse=True)
def _postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's indexes")


@pytest.mark.parametrize(("column", "index"), [
    ("array_id", "job_array_member"),
    ("current_attempt_id", "job_current_attempt"),
    ("group_id", "job_group_"),
    ("user_id", "job_user_newest"),
])
def test_each_lookup_of_a_job_by_a_reference_has_an_index(column, index):
    shown = plan(column)
    assert index in shown and "Seq Scan" not in shown, shown


def test_no_index_of_the_job_table_repeats_the_leading_columns_of_another():
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT i.relname, x.indkey::text, x.indpred IS NOT NULL, x.indisunique
            FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
            WHERE t.relname = %s AND x.indexprs IS NULL""", [Job._meta.db_table])
        indexes = [(name, keys.split(), partial, unique) for name, keys, partial, unique in cursor.fetchall()]
    redundant = [(name, other) for name, keys, partial, unique in indexes if not partial and not unique
                 for other, longer, other_partial, _ in indexes
                 if other != name and not other_partial and len(longer) > len(keys) and longer[:len(keys)] == keys]
    assert redundant == []


def test_a_job_in_no_array_and_without_an_attempt_is_in_neither_partial_index():
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexrelid::regclass::text, pg_get_expr(indpred, indrelid) FROM pg_index "
                       "WHERE indexrelid::regclass::text IN ('job_array_member', 'job_current_attempt')")
        predicates = dict(cursor.fetchall())
    assert predicates == {"job_array_member": "(array_id IS NOT NULL)",
                          "job_current_attempt": "(current_attempt_id IS NOT NULL)"}
