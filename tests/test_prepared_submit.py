"""A submit's writes as one statement (jobs.prepared_submit): the job, its event and its `Idempotency-Key` are
the rows Django's ``save`` writes in steps, in one round trip that is its own transaction; a key another submit
holds writes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DataError, connection
from django.db.models.signals import pre_save
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from psycopg import _queries as psycopg_queries

from jobs import prepared_submit
from jobs.choices import Priority
from jobs.models import Job, JobEvent, SubmitKey
from jobs.services import SUBMIT_KEY_TTL, SubmitKeyTaken, job_spec_validate, job_submit, submission

pytestmark = [pytest.mark.fast, pytest.mark.django_db]

SPEC = {"group": "phusers", "image": "base-notebook", "instance_type": "gpu-1", "command": "python train.py",
        "env": {"LR": "0.1"}, "ports": [{"port": 8888, "name": "lab"}], "priority": Priority.HIGH, "preemptible": True}


def spec_of(world, user="bob", **over):
    return job_spec_validate(user=world.users[user], data={**SPEC, **over})


def written(job: Job) -> dict:
    """The job's row as read back, less what differs between two submits by nature (ids and times)."""
    row = model_to_dict(Job.objects.get(pk=job.pk))
    return {k: v for k, v in row.items() if k not in ("id", "created_at", "updated_at", "queued_at")}


def test_one_statement_writes_the_rows_that_save_writes_in_steps(world, monkeypatch):
    """The same spec written in one statement, in steps (elsewhere than PostgreSQL: each row from SQL made once) and
    by Django's own ``save``: the same row."""
    bob, spec = world.users["bob"], spec_of(world)
    sent = []

    def count_params(execute, sql, params, many, context):
        sent.append(len(params))
        return execute(sql, params, many, context)

    with CaptureQueriesContext(connection) as queries, connection.execute_wrapper(count_params):
        fast = job_submit(user=bob, spec=spec, idempotency_key="k-1", fingerprint="f" * 64)
    assert [q["sql"][:5] for q in queries] == ["WITH "]  # one statement
    # The columns left NULL are not sent: psycopg keeps its conversion of a statement of at most 50 parameters.
    assert sent[0] <= psycopg_queries.MAX_CACHED_STATEMENT_PARAMS
    monkeypatch.setattr(prepared_submit, "usable", lambda: False)
    with CaptureQueriesContext(connection) as queries:
        slow = job_submit(user=bob, spec=spec, idempotency_key="k-2", fingerprint="f" * 64)
    assert len(queries) > 1

    django = submission.job_from_spec(spec, user=bob, now=timezone.now())
    django.save(force_insert=True)  # Django's own save, for reference

    assert written(fast) == written(slow) == written(django)
    assert written(fast)["ports"] == [{"port": 8888, "name": "lab"}] and written(fast)["env"] == {"LR": "0.1"}
    stored = Job.objects.get(pk=fast.pk)
    assert (stored.created_at, stored.updated_at, stored.queued_at) == (fast.created_at, fast.updated_at,
                                                                        fast.queued_at)
    for job in (fast, slow):
        [event] = JobEvent.objects.filter(job=job)
        assert (event.type, event.reason, event.message, event.attempt_id) == (
            "Normal", "Submitted", "Submitted by bob to phusers", None)
    assert [(e.pk, e.time) for e in fast.events_recorded] == [
        (e.pk, e.time) for e in JobEvent.objects.filter(job=fast)]
    key = SubmitKey.objects.get(user=bob, key="k-1")
    assert (key.job_id, key.fingerprint, key.created_at) == (fast.pk, "f" * 64, fast.queued_at)


def test_the_key_takes_an_expired_rows_place_and_drops_the_users_other_expired_keys(world):
    bob, lin = world.users["bob"], world.users["lin"]
    old = job_submit(user=bob, spec=spec_of(world), idempotency_key="again", fingerprint="a")
    job_submit(user=bob, spec=spec_of(world), idempotency_key="stale", fingerprint="b")
    job_submit(user=lin, spec=spec_of(world, "lin"), idempotency_key="lins", fingerprint="c")
    long_ago = timezone.now() - SUBMIT_KEY_TTL - timedelta(minutes=1)
    SubmitKey.objects.update(created_at=long_ago)

    new = job_submit(user=bob, spec=spec_of(world), idempotency_key="again", fingerprint="d")

    assert new.pk != old.pk
    assert sorted(SubmitKey.objects.values_list("user__username", "key", "job_id", "fingerprint")) == [
        ("bob", "again", new.pk, "d"), ("lin", "lins", Job.objects.get(user=lin).pk, "c")]


def test_a_key_another_submit_holds_writes_nothing(world):
    bob = world.users["bob"]
    first = job_submit(user=bob, spec=spec_of(world), idempotency_key="held", fingerprint="a")
    counts = Job.objects.count(), JobEvent.objects.count(), SubmitKey.objects.count()

    with pytest.raises(SubmitKeyTaken):
        job_submit(user=bob, spec=spec_of(world), idempotency_key="held", fingerprint="a")

    assert (Job.objects.count(), JobEvent.objects.count(), SubmitKey.objects.count()) == counts
    assert SubmitKey.objects.get(key="held").job_id == first.pk
    assert job_submit(user=bob, spec=spec_of(world), idempotency_key="next", fingerprint="a").pk > first.pk


@pytest.mark.django_db(transaction=True)  # no test transaction around it: the statement is its own
def test_the_statement_is_atomic_by_itself(world):
    """An event the database refuses (a reason longer than its column) leaves no job behind either."""
    bob = world.users["bob"]
    job = submission.job_from_spec(spec_of(world), user=bob, now=timezone.now())
    event = JobEvent(job=job, reason="R" * 61, message="too long a reason")
    assert connection.get_autocommit()

    with pytest.raises(DataError):
        prepared_submit.write(job, event)

    assert not Job.objects.exists() and not JobEvent.objects.exists()


def test_a_model_whose_saves_are_listened_to_is_saved_by_django(world):
    seen = []

    def listener(sender, instance, **kwargs):
        seen.append(instance.name)

    assert prepared_submit.usable()
    pre_save.connect(listener, sender=Job)
    try:
        assert not prepared_submit.usable()
        job = job_submit(user=world.users["bob"], spec=spec_of(world, name="heard"))
    finally:
        pre_save.disconnect(listener, sender=Job)
    assert seen == ["heard"] and Job.objects.get(pk=job.pk).name == "heard"
