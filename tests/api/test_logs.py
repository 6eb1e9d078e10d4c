"""GET /api/v1/jobs/{id}/logs/: the log file of one replica of one attempt, as text/plain."""

import pytest

from scheduler.backend_factory import get_backend
from scheduler.passes import schedule_pass

from .conftest import assert_error_shape, job_url


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


# --- ?failed=true: the first failed rank's log, as mcli logs --failed -------------------------------------------


def failed(job, number: int, rank: int | None, exit_code: int | None = None):
    """Mark attempt ``number`` of ``job`` as the scheduler does once a replica of it fails."""
    from jobs.models import Attempt

    Attempt.objects.filter(job=job, number=number).update(failed_rank=rank, exit_code=exit_code)


@pytest.fixture
def two_attempts(admitted):
    """Attempt 1 (two replicas: rank 1 failed first) and attempt 2, the current one (no replica failed yet)."""
    from jobs.models import Attempt

    failed(admitted, 1, 1, exit_code=3)
    second = Attempt.objects.create(job=admitted, number=2, replicas=2, gpu=1, backend="local")
    admitted.current_attempt = second
    admitted.save(update_fields=["current_attempt"])
    for number in (1, 2):
        for rank in (0, 1):
            write_log(admitted, number, rank, f"attempt {number} rank {rank}\n".encode())
    return admitted


@pytest.mark.django_db
def test_failed_reads_the_first_failed_rank(admitted, client_for):
    write_log(admitted, 1, 0, b"rank zero was fine\n")
    write_log(admitted, 1, 1, b"rank one: CUDA error\n")
    failed(admitted, 1, 1, exit_code=3)
    client = client_for("pan")
    url = job_url(admitted.pk, "logs")

    for value in ("true", "True", "1"):
        response = client.get(url, {"failed": value})
        assert response.status_code == 200
        assert body(response) == b"rank one: CUDA error\n"
        assert (response["X-Log-Replica"], response["X-Log-Failed-Rank"], response["X-Log-Attempt"]) == ("1", "1", "1")
    assert body(client.get(url, {"failed": "true", "attempt": 1})) == b"rank one: CUDA error\n"
    assert body(client.get(url, {"failed": "true", "replica": 1})) == b"rank one: CUDA error\n"  # the same rank
    assert body(client.get(url, {"failed": "true", "tail_bytes": 6})) == b"error\n"  # slices work as for replica
    # failed=false (or left out) is the plain replica choice; every answer says which rank failed first.
    plain = client.get(url, {"failed": "false"})
    assert (body(plain), plain["X-Log-Replica"], plain["X-Log-Failed-Rank"]) == (b"rank zero was fine\n", "0", "1")
    assert body(client.get(url, {"failed": "0", "replica": 1})) == b"rank one: CUDA error\n"


@pytest.mark.django_db
def test_failed_follows_the_asked_attempt(two_attempts, client_for):
    client = client_for("bob")
    url = job_url(two_attempts.pk, "logs")
    assert body(client.get(url, {"failed": "true", "attempt": 1})) == b"attempt 1 rank 1\n"

    # The default attempt is the current one, where nothing failed yet: a 404 that says so.
    response = client.get(url, {"failed": "true"})
    assert response.status_code == 404
    assert response.json()["detail"] == "No replica of attempt 2 failed."
    assert client.get(url)["X-Log-Failed-Rank"] == ""

    failed(two_attempts, 2, 0, exit_code=137)
    response = client.get(url, {"failed": "true"})
    assert (body(response), response["X-Log-Attempt"], response["X-Log-Replica"]) == (b"attempt 2 rank 0\n", "2", "0")


@pytest.mark.django_db
def test_failed_without_a_failed_replica_is_404(submit, admitted, client_for):
    write_log(admitted, 1, 0, LOG)
    client = client_for("bob")
    response = client.get(job_url(admitted.pk, "logs"), {"failed": "true"}, HTTP_ACCEPT="text/plain")
    assert response.status_code == 404
    assert response.content.decode() == "No replica of attempt 1 failed.\n"

    queued = submit("bob", "gpu-4")  # no attempt at all
    response = client.get(job_url(queued.pk, "logs"), {"failed": "true"})
    assert response.status_code == 404
    assert "no attempt yet" in response.json()["detail"]


@pytest.mark.django_db
@pytest.mark.parametrize("params,field", [
    ({"failed": "maybe"}, "failed"), ({"failed": "yes please"}, "failed"), ({"failed": "2"}, "failed"),
    ({"failed": "true", "replica": 0}, "replica"),  # rank 1 failed first, not rank 0
    ({"failed": "true", "replica": "x"}, "replica"),
])
def test_bad_failed_parameters_are_400(admitted, client_for, params, field):
    write_log(admitted, 1, 1, b"rank one\n")
    failed(admitted, 1, 1, exit_code=3)
    response = client_for("bob").get(job_url(admitted.pk, "logs"), params)
    data = assert_error_shape(response, 400, field)
    assert set(data["errors"]) == {field}
    if field == "failed":
        assert data["errors"]["failed"] == ["Give true or false."]
    elif params["replica"] == 0:
        assert "replica 1" in data["errors"]["replica"][0] and "not the first failed replica" in data["detail"]


@pytest.mark.django_db
def test_attempts_list_and_job_detail_show_the_failed_rank(two_attempts, client_for):
    client = client_for("bob")
    attempts = client.get(job_url(two_attempts.pk, "attempts")).json()["results"]
    assert [(a["number"], a["failed_rank"], a["exit_code"]) for a in attempts] == [(1, 1, 3), (2, None, None)]
    detail = client.get(job_url(two_attempts.pk)).json()
    assert [(a["number"], a["failed_rank"]) for a in detail["attempts"]] == [(1, 1), (2, None)]


def test_failed_and_failed_rank_are_in_the_schema(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    logs = schema["paths"]["/api/v1/jobs/{id}/logs/"]["get"]
    params = {p["name"]: p for p in logs["parameters"]}
    assert params["failed"]["in"] == "query" and params["failed"]["schema"]["type"] == "boolean"
    assert "first replica that failed" in params["failed"]["description"]
    assert {"X-Log-Replica", "X-Log-Failed-Rank"} <= set(logs["responses"]["200"]["headers"])
    for name in ("Attempt", "AttemptDetail"):
        rank = schema["components"]["schemas"][name]["properties"]["failed_rank"]
        assert rank["type"] == "integer" and rank.get("nullable") is True
