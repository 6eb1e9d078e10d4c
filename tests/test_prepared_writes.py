"""The hottest writes with their SQL made once (jobs.prepared_writes): a transition's UPDATE of the columns that
changed and its event's INSERT write what Django's ``save`` and ``create`` write, without compiling again."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection
from django.db.models import F
from django.db.models.sql.compiler import SQLInsertCompiler, SQLUpdateCompiler
from django.test.utils import CaptureQueriesContext

from jobs.models import Attempt, Job, JobEvent
from jobs.prepared_writes import insert, update_fields

pytestmark = [pytest.mark.fast, pytest.mark.django_db]


def no_compiling(monkeypatch) -> None:
    for compiler in (SQLInsertCompiler, SQLUpdateCompiler):
        monkeypatch.setattr(compiler, "as_sql", lambda *a, **k: pytest.fail("compiled again"))


def test_an_update_writes_the_named_columns_only_and_its_auto_now(submit, monkeypatch):
    job, other = submit("bob"), submit("bob")
    before = Job.objects.get(pk=job.pk).updated_at
    update_fields(other, ["message"])  # the SQL for these columns, made once
    no_compiling(monkeypatch)
    name = job.name
    job.message, job.status, job.name = "moved", "Running", "not written"
    with CaptureQueriesContext(connection) as queries:
        update_fields(job, ["message", "status", "updated_at"])
    assert len(queries) == 1 and queries[0]["sql"].startswith("UPDATE")
    row = Job.objects.get(pk=job.pk)
    assert (row.message, row.status, row.name) == ("moved", "Running", name)
    assert row.updated_at > before and row.updated_at == job.updated_at
    update_fields(other, ["message"])
    assert Job.objects.get(pk=other.pk).name == other.name


def test_an_update_of_a_row_gone_raises_as_save_does(submit):
    job = submit("bob")
    Job.objects.filter(pk=job.pk).delete()
    job.message = "gone"
    with pytest.raises(DatabaseError):
        update_fields(job, ["message"])


def test_an_expression_goes_through_django(submit):
    job = submit("bob")
    before = job.priority
    job.priority = F("priority") + 1
    update_fields(job, ["priority"])
    assert Job.objects.get(pk=job.pk).priority == before + 1


def test_an_insert_writes_the_row_and_reads_its_key_in_one_statement(submit, monkeypatch):
    job = submit("bob")
    attempt = insert(Attempt(job=job, number=7, replicas=2, gpu=1, backend="local",
                             placement={"0": {"node": "n1", "gpu_ids": [3]}}))
    no_compiling(monkeypatch)
    with CaptureQueriesContext(connection) as queries:
        event = insert(JobEvent(job=job, attempt=attempt, reason="Admitted", message="on n1"))
    assert len(queries) == 1
    assert event.pk and event.time and not event._state.adding
    assert JobEvent.objects.get(pk=event.pk).message == "on n1"
    assert JobEvent.objects.get(pk=event.pk).time == event.time  # auto_now_add, as create sets it
    row = Attempt.objects.get(pk=attempt.pk)
    assert (row.number, row.replicas, row.placement) == (7, 2, {"0": {"node": "n1", "gpu_ids": [3]}})
    second = insert(JobEvent(job=job, reason="Started"))
    assert second.pk > event.pk and second.attempt_id is None


def test_a_model_whose_saves_are_listened_to_is_saved_by_django(submit):
    from django.db.models.signals import post_save

    heard = []
    job = submit("bob")
    post_save.connect(lambda instance, **kw: heard.append(instance.message), sender=Job, weak=False,
                      dispatch_uid="heard")
    try:
        job.message = "listened"
        update_fields(job, ["message"])
        insert(JobEvent(job=job, reason="Heard"))  # nobody listens to events: no signal needed
    finally:
        post_save.disconnect(sender=Job, dispatch_uid="heard")
    assert heard == ["listened"] and Job.objects.get(pk=job.pk).message == "listened"


def test_a_row_updated_by_its_key_while_a_column_is_empty_counts_what_it_changed(submit, monkeypatch):
    """A launch's claim: the row written only while ``launched_at`` is empty, the count telling who claimed it."""
    from django.utils import timezone

    from jobs.prepared_writes import update_row

    job = submit("bob")
    first, other = (insert(Attempt(job=job, number=n, replicas=1, gpu=0, backend="local")) for n in (1, 2))
    update_row(Attempt, other.pk, {"launched_at": timezone.now()}, where_null=("launched_at",))  # made once
    no_compiling(monkeypatch)
    at = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        assert update_row(Attempt, first.pk, {"launched_at": at}, where_null=("launched_at",)) == 1
        assert update_row(Attempt, first.pk, {"launched_at": timezone.now()}, where_null=("launched_at",)) == 0
    assert len(queries) == 2
    assert Attempt.objects.get(pk=first.pk).launched_at == at  # the first claim's, not the second's
    assert update_row(Attempt, first.pk, {"backend_data": {"root": "/x"}}) == 1  # JSON, prepared by its field
    assert Attempt.objects.get(pk=first.pk).backend_data == {"root": "/x"}
    assert update_row(Attempt, 10**9, {"backend_data": {}}) == 0  # a row gone: nothing, as update() does
    monkeypatch.undo()
    assert update_row(Attempt, first.pk, {"number": F("number") + 10}) == 1  # an expression: through Django
    assert Attempt.objects.get(pk=first.pk).number == 11
