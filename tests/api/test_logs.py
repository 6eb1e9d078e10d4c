"""GET /api/v1/jobs/{id}/logs/: the log file of one replica of one attempt, as text/plain."""

import pytest

from scheduler.backends import get_backend
from scheduler.passes import schedule_pass

from .conftest import job_url


def write_log(job, attempt_number: int, rank: int, content: bytes) -> None:
    path = get_backend("local").log_path(job_id=job.pk, attempt_number=attempt_number, rank=rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


@pytest.fixture
def admitted(submit):
    job = submit("bob", "gpu-1", replicas=2)
    schedule_pass()
    job.refresh_from_db()
    assert job.current_attempt.number == 1
    return job


LOG = "epoch 1 loss 0.9\nepoch 2 loss 0.5 ✓\n".encode()


@pytest.mark.django_db
def test_read_the_log_of_a_replica(admitted, client_for):
    write_log(admitted, 1, 0, LOG)
    write_log(admitted, 1, 1, b"rank one\n")
    client = client_for("pan")  # a member of the group may read

    response = client.get(job_url(admitted.pk, "logs"))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert body(response) == LOG

    assert body(client.get(job_url(admitted.pk, "logs"), {"replica": 1})) == b"rank one\n"
    assert body(client.get(job_url(admitted.pk, "logs"), {"replica": 0, "attempt": 1})) == LOG


@pytest.mark.django_db
@pytest.mark.parametrize("accept", ["text/plain", "application/json", "*/*", "text/html,*/*;q=0.8"])
def test_logs_are_text_whatever_the_client_accepts(admitted, client_for, accept):
    write_log(admitted, 1, 0, LOG)
    response = client_for("bob").get(job_url(admitted.pk, "logs"), HTTP_ACCEPT=accept)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert body(response) == LOG


@pytest.mark.django_db
def test_tail_bytes(admitted, client_for):
    write_log(admitted, 1, 0, b"0123456789")
    client = client_for("bob")
    url = job_url(admitted.pk, "logs")
    assert body(client.get(url, {"tail_bytes": 4})) == b"6789"
    assert body(client.get(url, {"tail_bytes": 100})) == b"0123456789"
    assert body(client.get(url, {"tail_bytes": 0})) == b""
    assert client.get(url, {"tail_bytes": -1}).status_code == 400
    assert client.get(url, {"tail_bytes": "all"}).status_code == 400


@pytest.mark.django_db
def test_no_log_yet_is_empty(submit, admitted, client_for):
    client = client_for("bob")
    response = client.get(job_url(admitted.pk, "logs"))  # admitted, no file written yet
    assert (response.status_code, body(response)) == (200, b"")
    assert response["Content-Type"] == "text/plain; charset=utf-8"

    queued = submit("bob", "gpu-4")  # waits behind the running job: no attempt at all
    response = client.get(job_url(queued.pk, "logs"))
    assert (response.status_code, body(response)) == (200, b"")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "params,status",
    [({"replica": 2}, 404), ({"replica": 99}, 404), ({"attempt": 2}, 404), ({"attempt": 0}, 404),
     ({"attempt": 2**70}, 404), ({"replica": "x"}, 400), ({"replica": "1.5"}, 400), ({"attempt": "last"}, 400),
     ({"replica": -1}, 400)],
)
def test_out_of_range_and_bad_parameters(admitted, client_for, params, status):
    write_log(admitted, 1, 0, LOG)
    response = client_for("bob").get(job_url(admitted.pk, "logs"), params)
    assert response.status_code == status
    assert response.json()


@pytest.mark.django_db
def test_errors_are_text_for_text_only_clients(admitted, client_for):
    response = client_for("bob").get(job_url(admitted.pk, "logs"), {"replica": 5}, HTTP_ACCEPT="text/plain")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/plain")
    assert b"Replica 5 does not exist" in response.content


@pytest.mark.django_db
def test_logs_of_an_earlier_attempt(admitted, client_for):
    from jobs.models import Attempt

    Attempt.objects.create(job=admitted, number=2, replicas=1, gpu=1, backend="local")
    write_log(admitted, 2, 0, b"second try\n")
    client = client_for("bob")
    url = job_url(admitted.pk, "logs")
    assert body(client.get(url, {"attempt": 2})) == b"second try\n"
    assert client.get(url, {"attempt": 2, "replica": 1}).status_code == 404  # attempt 2 had one replica
    assert body(client.get(url)) == b""  # the current attempt is still 1, with no file


# --- byte ranges and the X-Log-* headers (what jobctl logs -f polls with) --------------------------------------


def headers(response) -> dict:
    return {k: response[k] for k in ("X-Log-Size", "X-Log-Start", "X-Log-End", "X-Log-Attempt",
                                     "X-Job-Current-Attempt", "X-Job-Phase", "X-Job-Finished")}


@pytest.mark.django_db
def test_byte_ranges_and_headers(admitted, client_for):
    write_log(admitted, 1, 0, b"0123456789")
    client = client_for("bob")
    url = job_url(admitted.pk, "logs")

    response = client.get(url, {"start": 3, "end": 7})
    assert body(response) == b"3456"
    assert headers(response) == {"X-Log-Size": "10", "X-Log-Start": "3", "X-Log-End": "7", "X-Log-Attempt": "1",
                                 "X-Job-Current-Attempt": "1", "X-Job-Phase": "PREPARING", "X-Job-Finished": "false"}
    assert body(client.get(url, {"start": 8})) == b"89"
    assert (body(r := client.get(url, {"start": 50})), r["X-Log-Start"], r["X-Log-End"]) == (b"", "10", "10")
    assert body(client.get(url, {"end": 2})) == b"01"
    assert body(client.get(url, {"end": 100})) == b"0123456789"
    tail = client.get(url, {"tail_bytes": 3})
    assert (body(tail), tail["X-Log-Start"], tail["X-Log-End"]) == (b"789", "7", "10")
    assert body(client.get(url, {"tail_bytes": 3, "end": 5})) == b"234"


@pytest.mark.django_db
def test_following_a_growing_log(admitted, client_for):
    client = client_for("bob")
    url = job_url(admitted.pk, "logs")
    write_log(admitted, 1, 0, b"line 1\n")
    first = client.get(url, {"start": 0})
    assert body(first) == b"line 1\n"
    write_log(admitted, 1, 0, b"line 1\nline 2\n")
    second = client.get(url, {"start": first["X-Log-End"]})
    assert body(second) == b"line 2\n"
    assert second["X-Log-End"] == second["X-Log-Size"] == "14"


@pytest.mark.django_db
def test_headers_without_an_attempt_and_after_the_end(submit, admitted, client_for):
    from jobs import services

    queued = submit("bob", "gpu-4")
    response = client_for("bob").get(job_url(queued.pk, "logs"))
    assert headers(response) == {"X-Log-Size": "0", "X-Log-Start": "0", "X-Log-End": "0", "X-Log-Attempt": "",
                                 "X-Job-Current-Attempt": "", "X-Job-Phase": "SUBMITTED", "X-Job-Finished": "false"}
    services.job_cancel(job=queued, by=queued.user)
    assert client_for("bob").get(job_url(queued.pk, "logs"))["X-Job-Finished"] == "true"


@pytest.mark.django_db
@pytest.mark.parametrize("params,field", [
    ({"start": 5, "end": 2}, "end"), ({"start": 1, "tail_bytes": 2}, "tail_bytes"),
    ({"start": -1}, "start"), ({"end": "x"}, "end"),
])
def test_bad_ranges_are_400(admitted, client_for, params, field):
    write_log(admitted, 1, 0, b"0123456789")
    response = client_for("bob").get(job_url(admitted.pk, "logs"), params)
    assert response.status_code == 400
    assert field in response.json()["errors"]


@pytest.mark.django_db
def test_text_errors_list_the_fields(admitted, client_for):
    response = client_for("bob").get(job_url(admitted.pk, "logs"), {"start": "x"}, HTTP_ACCEPT="text/plain")
    assert response.status_code == 400
    assert response.content.decode().splitlines() == ["start: Give a whole number."]
