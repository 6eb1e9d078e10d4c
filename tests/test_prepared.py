"""A prepared query (jobs.prepared) answers exactly what its queryset answers, for each call's own values, from SQL
compiled once."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.db import connection, transaction
from django.db.models.sql.compiler import SQLCompiler
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from jobs.models import Attempt, Job
from jobs.prepared import Prepared

pytestmark = [pytest.mark.fast, pytest.mark.django_db]

WITH_ATTEMPT = Prepared(lambda pk: Job.objects.select_related("current_attempt", "group").filter(pk=pk), pk=int)


def attempt_of(job: Job) -> Attempt:
    attempt = Attempt.objects.create(job=job, number=1, replicas=1, backend="local")
    Job.objects.filter(pk=job.pk).update(current_attempt=attempt)
    return attempt


def test_each_call_gets_its_own_row_with_its_related_objects_in_one_query(submit):
    first, second = submit("bob"), submit("pan", group="phusers")
    attempt = attempt_of(second)
    for job in (first, second, first):
        with CaptureQueriesContext(connection) as queries:
            got = WITH_ATTEMPT.get(pk=job.pk)
            related = (got.current_attempt, got.group.name)
        assert len(queries) == 1
        assert (got.pk, got.name, got.user_id) == (job.pk, job.name, job.user_id)
        assert related == ((attempt if job == second else None), "phusers")
    assert WITH_ATTEMPT.all(pk=first.pk) == [first]


def test_sql_is_compiled_once_and_values_never_leak_between_calls(submit, monkeypatch):
    jobs = [submit("bob") for _ in range(3)]
    query = Prepared(lambda user, phase: Job.objects.filter(user__username=user, phase=phase).order_by("pk")
                     .values_list("pk", flat=True), user=str, phase=str)
    assert query.all(user="bob", phase=jobs[0].phase) == [j.pk for j in jobs]
    monkeypatch.setattr(SQLCompiler, "as_sql", lambda *a, **k: pytest.fail("compiled again"))
    assert query.all(user="pan", phase=jobs[0].phase) == []
    assert query.all(user="bob", phase="Running") == []
    assert query.all(user="bob", phase=jobs[0].phase) == [j.pk for j in jobs]


def test_a_miss_and_several_rows_raise_as_get_does(submit):
    job = submit("bob")
    with pytest.raises(Job.DoesNotExist):
        WITH_ATTEMPT.get(pk=job.pk + 1000)
    submit("bob")
    by_user = Prepared(lambda user_id: Job.objects.filter(user_id=user_id), user_id=int)
    with pytest.raises(Job.MultipleObjectsReturned):
        by_user.get(user_id=job.user_id)


def test_a_value_the_queryset_rewrites_is_built_on_every_call(submit):
    job = submit("bob", name="alpha-run")
    submit("bob", name="beta-run")
    containing = Prepared(lambda part: Job.objects.filter(name__icontains=part).values_list("name", flat=True),
                          part=str)
    assert containing.all(part="ALPHA") == ["alpha-run"]
    assert sorted(containing.all(part="-run")) == ["alpha-run", "beta-run"]
    assert containing.all(part=job.name[:3]) == ["alpha-run"]


@pytest.mark.django_db(transaction=True)
def test_a_locking_read_needs_a_transaction_and_locks(submit):
    job = submit("bob")
    locked = Prepared(lambda pk: Job.objects.select_for_update(of=("self",)).filter(pk=pk), pk=int)
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        assert locked.get(pk=job.pk) == job
    assert "FOR UPDATE" in queries.captured_queries[-1]["sql"]
    with pytest.raises(TransactionManagementError):
        locked.get(pk=job.pk)
    with transaction.atomic():
        assert locked.get(pk=job.pk) == job


def test_a_datetime_value_goes_in_as_the_database_takes_it(submit, monkeypatch):
    """The scheduler's clocks (backoff over, TTL due) ask for rows older than now, every round."""
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    early, late = submit("bob"), submit("bob")
    Job.objects.filter(pk=early.pk).update(retry_at=now - timedelta(seconds=5))
    Job.objects.filter(pk=late.pk).update(retry_at=now + timedelta(seconds=5))
    due = Prepared(lambda now: Job.objects.filter(retry_at__lte=now).values_list("pk", flat=True), now=datetime)
    assert due.all(now=now) == [early.pk]
    monkeypatch.setattr(SQLCompiler, "as_sql", lambda *a, **k: pytest.fail("compiled again"))
    assert due.all(now=now - timedelta(seconds=10)) == []
    assert sorted(due.all(now=now + timedelta(seconds=10))) == [early.pk, late.pk]


def test_only_int_str_and_datetime_values_named_as_the_builder_names_them():
    with pytest.raises(TypeError):
        Prepared(lambda pk: Job.objects.filter(pk=pk), key=int)
    with pytest.raises(TypeError):
        Prepared(lambda pk: Job.objects.filter(pk=pk), pk=float)
    with pytest.raises(TypeError):
        WITH_ATTEMPT.all(id=1)


def test_the_queue_heads_compiled_once_are_those_of_the_query_built_each_pass(world, submit, monkeypatch):
    """The embedded default's SQLite reads the groups' heads with a compiled query (HEADS, a list of groups): the
    same rows as the query built anew (here on the suite's database), however many groups are asked."""
    from jobs.choices import Phase
    from scheduler.core import Reason
    from scheduler.snapshot import HEADS

    for user, group, priority in [("bob", "phusers", 0), ("pan", "phusers", 10), ("lin", "research", 0),
                                  ("lin", "research", 5), ("bob", "phusers", 10)]:
        job = submit(user, group=group)
        Job.objects.filter(pk=job.pk).update(phase=Phase.PENDING, reason=Reason.BLOCKED, priority=priority)
    groups = [world.groups["phusers"].pk, world.groups["research"].pk]
    built = {(tuple(gids), limit): sorted(HEADS.build(groups=gids, limit=limit))
             for gids in (groups, groups[:1]) for limit in (1, 2, 5)}
    assert all(built.values())
    HEADS.all(groups=groups, limit=1)
    HEADS.all(groups=groups[:1], limit=1)
    monkeypatch.setattr(SQLCompiler, "as_sql", lambda *a, **k: pytest.fail("compiled again"))
    assert {key: sorted(HEADS.all(groups=list(key[0]), limit=key[1])) for key in built} == built


def test_a_list_of_ids_is_compiled_once_for_each_length(submit, monkeypatch):
    jobs = [submit("bob") for _ in range(4)]
    ids = [j.pk for j in jobs]
    names = Prepared(lambda ids: Job.objects.filter(pk__in=ids).order_by("pk").values_list("pk", flat=True),
                     ids=list)
    assert names.all(ids=ids[:2]) == ids[:2] and names.all(ids=ids[:3]) == ids[:3]
    monkeypatch.setattr(SQLCompiler, "as_sql", lambda *a, **k: pytest.fail("compiled again"))
    assert names.all(ids=ids[2:]) == ids[2:]  # other values, the length compiled before
    assert names.all(ids=[ids[3], ids[0], ids[1]]) == [ids[0], ids[1], ids[3]]
    assert names.all(ids=(ids[1], 10**9)) == [ids[1]]  # any sequence; an id no row has


def test_an_empty_or_long_list_is_built_as_django_builds_it(submit, django_assert_num_queries):
    from jobs import prepared

    job = submit("bob")
    names = Prepared(lambda ids: Job.objects.filter(pk__in=ids).values_list("pk", flat=True), ids=list)
    with django_assert_num_queries(0):  # Django answers an empty list without the database
        assert names.all(ids=[]) == []
    many = [job.pk, *range(10**9, 10**9 + prepared.LIST_MAX)]
    assert names.all(ids=many) == [job.pk] and (len(many),) not in names._compiled  # built, not kept


def test_every_prepared_query_of_the_project_is_compiled_once():
    """A value the compiler rewrote (or wrapped in a way not undone) would leave a query built on every call,
    silently: each of the project's prepared queries finds all of its values in its SQL."""
    import importlib
    import pkgutil

    import jobs
    import scheduler

    found = {}
    for package in (jobs, scheduler):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if ".migrations" in module.name or ".management" in module.name:
                continue
            for name, value in vars(importlib.import_module(module.name)).items():
                if isinstance(value, Prepared):
                    found[f"{module.name}.{name}"] = value
    assert len(found) >= 15
    assert [name for name, query in found.items() if query._compile() is None] == []


def test_the_columns_converters_are_worked_out_once(submit, monkeypatch):
    """A JSON column comes back decoded, a datetime as Django gives it, on every call; the converters of the
    columns are looked up on the first only."""
    job = submit("bob")
    Job.objects.filter(pk=job.pk).update(env={"A": "1"})
    query = Prepared(lambda pk: Job.objects.filter(pk=pk).values_list("env", "created_at"), pk=int)
    expected = list(Job.objects.filter(pk=job.pk).values_list("env", "created_at"))
    looked_up = []
    own = SQLCompiler.get_converters
    monkeypatch.setattr(SQLCompiler, "get_converters", lambda self, e: looked_up.append(1) or own(self, e))
    assert [query.all(pk=job.pk) for _ in range(3)] == [expected] * 3
    assert expected[0][0] == {"A": "1"} and len(looked_up) == 1
