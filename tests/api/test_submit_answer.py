"""A write's answer is built inside its transaction: a database connection lost right after the commit cannot turn
a saved job into a 500 (and the client's retry into a second job)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import jobs.live_publisher
from jobs import services
from jobs.choices import Phase
from jobs.models import Job
from jobs.services import submission
from scheduler.leader import dedicated_connection

from .conftest import JOBS_URL, job_url

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit callbacks run: a real commit

GOOD = {"group": "phusers", "image": "base-notebook", "instance_type": "gpu-1", "command": "python train.py"}
# What a submit costs, counted with Django's own query log (BEGIN and COMMIT included), once the checks' lookups
# are kept (jobs.services.submit_lookups): the token, then the job, its event and its key in one statement, its own
# transaction (jobs.prepared_submit). Before: 5 (the token, BEGIN, the job, its event, COMMIT), 6 with a key; 12 and
# 17 before the lookups were kept.
SUBMIT_QUERIES = 2


class Killer:
    """Once armed, ends the database connection of whoever commits a write, right after the commit (in the first
    on_commit callback of every write: its live update), as a restart or failover of PostgreSQL would."""

    def __init__(self):
        self.armed = False
        self.killed: list[int] = []

    def __call__(self, job_ids) -> None:
        if not self.armed:
            return
        pid = connection.connection.info.backend_pid
        with dedicated_connection() as admin:
            # Waits (up to 30 s) until that backend has ended: the request's next query would fail.
            assert admin.execute("SELECT pg_terminate_backend(%s, 30000)", [pid]).fetchone()[0]
        self.killed.append(pid)
        self.armed = False

    def fresh_connection(self) -> None:
        """The test's own next query on another connection (the pool checks it before handing it out)."""
        connection.close()


@pytest.fixture
def killer(monkeypatch):
    kill = Killer()
    monkeypatch.setattr(jobs.live_publisher, "publish_job_changes", kill)
    yield kill
    kill.fresh_connection()


@pytest.mark.parametrize("key", [None, "retry-safe-1"])
def test_a_submit_saved_before_its_connection_died_answers_201(world, client_for, killer, key):
    bob = client_for("bob")
    headers = {"Idempotency-Key": key} if key else {}
    killer.armed = True

    response = bob.post(JOBS_URL, GOOD, format="json", headers=headers)

    assert killer.killed, "the connection was not ended after the commit"
    assert response.status_code == 201, response.content[:500]
    killer.fresh_connection()
    job = Job.objects.get()  # exactly one job
    data = response.json()
    assert data["id"] == job.pk and data["status"] == "Submitted" and data["attempts"] == []
    assert [e["reason"] for e in data["events"]] == ["Submitted"]
    assert response["Location"].endswith(job_url(job.pk))
    if key:
        assert response["Idempotent-Replayed"] == "false"
        again = bob.post(JOBS_URL, GOOD, format="json", headers=headers)  # the client's retry
        assert again.status_code == 201 and again.json()["id"] == job.pk
        assert Job.objects.count() == 1
    # The answer is what the job's detail shows.
    assert bob.get(job_url(job.pk)).json() == data


def _ended(user) -> Job:
    job = services.job_submit(user=user, spec=services.job_spec_validate(user=user, data=GOOD))
    return services.job_cancel(job=job, by=user, stop=True)


@pytest.mark.parametrize("action, status_code, phase", [
    ("clone", 201, Phase.SUBMITTED),
    ("restart", 200, Phase.PENDING),
])
def test_clone_and_restart_answer_from_their_transaction(world, client_for, killer, action, status_code, phase):
    job = _ended(world.users["bob"])
    bob = client_for("bob")
    killer.armed = True

    response = bob.post(job_url(job.pk, action), {}, format="json")

    assert killer.killed, "the connection was not ended after the commit"
    assert response.status_code == status_code, response.content[:500]
    killer.fresh_connection()
    data = response.json()
    assert data["phase"] == phase
    assert Job.objects.count() == (2 if action == "clone" else 1)
    assert Job.objects.get(pk=data["id"]).phase == phase
    assert bob.get(job_url(data["id"])).json() == data


@pytest.mark.parametrize("key", [None, "k-1"])
def test_a_submit_reads_nothing_after_its_commit(world, client_for, django_assert_max_num_queries, key):
    bob = client_for("bob")
    assert bob.post(JOBS_URL, GOOD, format="json").status_code == 201  # the token, the lookups kept from now on
    headers = {"Idempotency-Key": key} if key else {}

    with django_assert_max_num_queries(SUBMIT_QUERIES), CaptureQueriesContext(connection) as queries:
        response = bob.post(JOBS_URL, GOOD, format="json", headers=headers)

    assert response.status_code == 201
    statements = [q["sql"] for q in queries.captured_queries]
    write = statements[-1]  # the last: nothing is read after it
    assert write.startswith("WITH ") and 'INSERT INTO "jobs_job"' in write and 'INSERT INTO "jobs_jobevent"' in write
    assert ('INSERT INTO "jobs_submitkey"' in write) == bool(key)
    assert not any(s in ("BEGIN", "COMMIT") or s.startswith("SAVEPOINT") for s in statements)
    assert [e["reason"] for e in response.json()["events"]] == ["Submitted"]  # from what was written


def test_a_submit_that_waits_for_another_commits_its_writes_last(world, client_for):
    """A job with dependencies is written in steps, in one transaction, and answered before its commit."""
    bob = client_for("bob")
    first = bob.post(JOBS_URL, GOOD, format="json").json()["id"]

    with CaptureQueriesContext(connection) as queries:
        response = bob.post(JOBS_URL, {**GOOD, "after": [{"job": first}]}, format="json")

    assert response.status_code == 201, response.content[:500]
    statements = [q["sql"] for q in queries.captured_queries]
    assert statements[-1] == "COMMIT" and statements.count("COMMIT") == 1, statements[-3:]
    assert [d["job"] for d in response.json()["after"]] == [first], response.json().get("after")


def test_an_after_commit_effect_that_fails_never_fails_the_saved_write(world, client_for, monkeypatch, caplog):
    """The effects after a commit (the live update, the scheduler's wake-up) are robust: one that raises is logged,
    and the saved job still answers 201 (issue 21.2)."""

    def broken(*args, **kwargs):
        raise RuntimeError("the channel layer fell over")

    monkeypatch.setattr(jobs.live_publisher, "publish_job_changes", broken)
    monkeypatch.setattr(submission, "request_admission", broken)
    response = client_for("bob").post(JOBS_URL, GOOD, format="json")
    assert response.status_code == 201, response.content[:500]
    assert Job.objects.get().pk == response.json()["id"]
    assert "the channel layer fell over" in caplog.text
