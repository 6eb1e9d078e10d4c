"""POST /api/v1/jobs/ with an `Idempotency-Key`: a retried submit answers the job the first one made."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobs import services
from jobs.models import InstanceType, Job, SubmitKey

from .conftest import JOBS_URL, assert_error_shape, job_url

GOOD = {"group": "phusers", "image": "base-notebook", "instance_type": "gpu-1", "command": "python train.py"}


def post(client, body, key=None):
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(JOBS_URL, body, format="json", headers=headers)


@pytest.mark.django_db
def test_the_same_key_and_body_answer_the_first_job(world, client_for):
    bob = client_for("bob")
    first = post(bob, GOOD, key="k-1")
    again = post(bob, GOOD, key="k-1")

    assert first.status_code == 201, first.json()
    assert first["Idempotent-Replayed"] == "false"
    assert again.status_code == 201, again.json()
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert again["Location"] == first["Location"]
    assert again["Location"].endswith(job_url(first.json()["id"]))
    assert Job.objects.count() == 1
    assert SubmitKey.objects.get().job_id == first.json()["id"]


@pytest.mark.django_db
def test_a_replay_answers_even_when_the_spec_would_no_longer_pass(world, client_for):
    """The retry of a submit that made a job is not submitted again: it is not checked against the rules again."""
    bob = client_for("bob")
    first = post(bob, GOOD, key="k-1")
    InstanceType.objects.get(name="gpu-1").groups.remove(world.groups["phusers"])
    assert post(bob, GOOD, key="k-2").status_code == 400  # a new submit is refused now
    Job.objects.filter(pk=first.json()["id"]).update(name="renamed meanwhile")

    again = post(bob, GOOD, key="k-1")

    assert again.status_code == 201, again.json()
    assert again.json()["name"] == "renamed meanwhile"  # the job's current detail
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_the_same_key_with_another_body_is_refused(world, client_for):
    bob = client_for("bob")
    first = post(bob, GOOD, key="k-1")
    other = post(bob, {**GOOD, "command": "python other.py"}, key="k-1")

    data = assert_error_shape(other, 422)
    assert "Idempotency-Key" in data["detail"] and "new key" in data["detail"]
    assert f"#{first.json()['id']}" in data["detail"]
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_keys_are_per_user(world, client_for):
    bob_job = post(client_for("bob"), GOOD, key="shared").json()
    pan_job = post(client_for("pan"), GOOD, key="shared")

    assert pan_job.status_code == 201, pan_job.json()
    assert pan_job["Idempotent-Replayed"] == "false"
    assert pan_job.json()["id"] != bob_job["id"]
    assert Job.objects.count() == 2


@pytest.mark.django_db
def test_without_a_key_every_submit_makes_a_job(world, client_for):
    bob = client_for("bob")
    assert post(bob, GOOD).status_code == 201
    response = post(bob, GOOD)
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response
    assert Job.objects.count() == 2
    assert SubmitKey.objects.count() == 0


@pytest.mark.django_db
def test_a_key_older_than_a_day_makes_a_new_job(world, client_for):
    bob = client_for("bob")
    first = post(bob, GOOD, key="k-1").json()
    SubmitKey.objects.update(created_at=timezone.now() - services.SUBMIT_KEY_TTL - timedelta(seconds=1))

    again = post(bob, {**GOOD, "command": "another body is fine now"}, key="k-1")

    assert again.status_code == 201, again.json()
    assert again["Idempotent-Replayed"] == "false"
    assert again.json()["id"] != first["id"]
    assert SubmitKey.objects.get().job_id == again.json()["id"]


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "tab\there"])
def test_a_malformed_key_is_a_400_and_writes_nothing(world, client_for, key):
    assert_error_shape(post(client_for("bob"), GOOD, key=key), 400, "Idempotency-Key")
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_the_unique_constraint_decides_not_the_check_before_the_insert(world):
    """Two submits that both passed the lookup: the second one writes nothing."""
    bob = world.users["bob"]
    spec = services.job_spec_validate(user=bob, data=dict(GOOD))
    services.job_submit(user=bob, spec=spec, idempotency_key="k-1", fingerprint="f")

    with pytest.raises(services.SubmitKeyTaken), transaction.atomic():  # no savepoint of its own: the caller's
        services.job_submit(user=bob, spec=spec, idempotency_key="k-1", fingerprint="f")

    assert Job.objects.count() == 1


class KeyLookups:
    """Counts the look-ups of an `Idempotency-Key`'s job a submit makes; ``answer`` gives what they find."""

    def __init__(self, answer):
        self.calls: list[dict] = []
        self.answer = answer

    def __call__(self, **kw):
        self.calls.append(kw)
        return self.answer(**kw)


@pytest.fixture
def lookups_of_keys(monkeypatch) -> KeyLookups:
    counted = KeyLookups(services.job_submitted_with)
    monkeypatch.setattr(services, "job_submitted_with", counted)
    return counted


@pytest.mark.django_db
def test_a_retry_is_found_by_the_constraint_and_answered_from_one_lookup(world, client_for, lookups_of_keys):
    """No look-up before the insert: the unique constraint finds the key taken, the job inserted is rolled back
    and the key's job answered."""
    winner = post(client_for("bob"), GOOD, key="k-1").json()
    assert lookups_of_keys.calls == []  # a new key: none either

    response = post(client_for("bob"), GOOD, key="k-1")

    assert len(lookups_of_keys.calls) == 1
    assert response.status_code == 201, response.json()
    assert response["Idempotent-Replayed"] == "true"
    assert response.json()["id"] == winner["id"]
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_a_key_held_by_a_submit_not_committed_yet_is_a_409(world, client_for, lookups_of_keys):
    """The insert waited for the other submit and hit the constraint, but the key's job is not visible yet."""
    post(client_for("bob"), GOOD, key="k-1")
    lookups_of_keys.answer = lambda **kw: None

    response = post(client_for("bob"), GOOD, key="k-1")

    assert_error_shape(response, 409)
    assert "in progress" in response.json()["detail"]
    assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_submits_with_one_key_make_one_job(world, client_for):
    clients = [client_for("bob") for _ in range(6)]
    start = threading.Barrier(len(clients))
    answers = [None] * len(clients)

    def submit(i):
        try:
            start.wait(timeout=60)
            response = post(clients[i], GOOD, key="same")
            answers[i] = (response.status_code, response.json().get("id"), response.get("Idempotent-Replayed"))
        finally:
            connection.close()

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)

    assert Job.objects.count() == 1
    job_id = Job.objects.get().pk
    assert sorted(answers, key=str) == sorted(
        [(201, job_id, "false")] + [(201, job_id, "true")] * (len(clients) - 1), key=str
    )
