"""Searching a whole log (GET /api/v1/jobs/{id}/logs/search/), the raw log (logs/raw/), and the follow step that
lets a viewer that fell behind skip to the newest bytes."""

import random

import pytest

from jobs import logs
from scheduler.passes import schedule_pass

from .conftest import assert_error_shape, job_url
from .test_logs import body, write_log


@pytest.fixture
def admitted(submit):
    job = submit("bob", "gpu-1", replicas=2)
    schedule_pass()
    job.refresh_from_db()
    return job


LOG = b"".join(f"step {i:05d} loss {i % 7}\n".encode() for i in range(1000))


def offsets(data: bytes, needle: bytes) -> list[int]:
    """Where each line with ``needle`` has it first (case-insensitive), by brute force."""
    found, line_start = [], 0
    for line in data.split(b"\n"):
        at = line.lower().find(needle.lower())
        if at >= 0:
            found.append(line_start + at)
        line_start += len(line) + 1
    return found


@pytest.mark.django_db
def test_search_finds_lines_with_byte_offsets(admitted, client_for):
    write_log(admitted, 1, 0, LOG)
    response = client_for("pan").get(job_url(admitted.pk, "logs/search"), {"q": "LOSS 3", "limit": 5})
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    data = response.json()
    assert data["size"] == len(LOG) and (data["attempt"], data["replica"]) == (1, 0)
    matches = data["matches"]
    assert [m["offset"] for m in matches] == offsets(LOG, b"loss 3")[:5]
    for m in matches:
        assert LOG[m["offset"]:m["offset"] + 6] == b"loss 3"
        assert LOG[m["line_start"]:m["line_end"]].decode() == m["text"]
        assert m["line_start"] == 0 or LOG[m["line_start"] - 1:m["line_start"]] == b"\n"
    assert matches[0]["text"] == "step 00003 loss 3"


@pytest.mark.django_db
def test_next_and_previous(admitted, client_for):
    write_log(admitted, 1, 0, LOG)
    client, url = client_for("bob"), job_url(admitted.pk, "logs/search")
    every = offsets(LOG, b"loss 6")
    first = client.get(url, {"q": "loss 6", "limit": 1}).json()["matches"][0]["offset"]
    following = client.get(url, {"q": "loss 6", "limit": 1, "after": first + 1}).json()["matches"][0]["offset"]
    assert [first, following] == every[:2]
    back = client.get(url, {"q": "loss 6", "limit": 1, "before": following}).json()["matches"]
    assert [m["offset"] for m in back] == [first]
    last_two = client.get(url, {"q": "loss 6", "limit": 2, "before": len(LOG)}).json()["matches"]
    assert [m["offset"] for m in last_two] == every[-2:]
    assert client.get(url, {"q": "loss 6", "after": every[-1] + 1}).json()["matches"] == []
    assert client.get(url, {"q": "loss 6", "before": first}).json()["matches"] == []
    assert client.get(url, {"q": "not in the log"}).json()["matches"] == []


@pytest.mark.parametrize("chunk", [400, 1000, 4096])  # longer than any line
def test_search_across_chunk_cuts_finds_what_brute_force_does(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(logs, "SEARCH_CHUNK_BYTES", chunk)
    rng = random.Random(chunk)
    words = [b"alpha", b"beta", b"NEEDLE", b"x" * 50, b"needle" + b"y" * 80]
    data = b"".join(b" ".join(rng.choice(words) for _ in range(rng.randint(0, 4))) + b"\n" for _ in range(400))
    path = tmp_path / "replica-0.log"
    path.write_bytes(data)
    expected = offsets(data, b"needle")
    assert [m.offset for m in logs.search_log(path, "needle", limit=10_000)] == expected
    assert [m.offset for m in logs.search_log(path, "needle", before=len(data), limit=10_000)] == expected
    middle = data.index(b"\n", len(data) // 2) + 1  # a line start
    assert [m.offset for m in logs.search_log(path, "needle", after=middle, limit=3)] == \
        [o for o in expected if o >= middle][:3]
    assert [m.offset for m in logs.search_log(path, "needle", before=middle, limit=3)] == \
        [o for o in expected if o < middle][-3:]


@pytest.mark.parametrize("chunk", [1, 7, 100])
def test_lines_longer_than_a_chunk(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(logs, "SEARCH_CHUNK_BYTES", chunk)
    path = tmp_path / "replica-0.log"
    path.write_bytes(b"short\n" + b"z" * 3001 + b"needle" + b"z" * 3000 + b"\nneedle\n")
    assert [m.offset for m in logs.search_log(path, "needle")] == [3007, 6014]
    assert [m.offset for m in logs.search_log(path, "needle", before=6014)] == [3007]
    assert [m.offset for m in logs.search_log(path, "needle", before=6020)] == [3007, 6014]


def test_a_60_mb_log_is_searched_in_bounded_pieces(tmp_path, monkeypatch):
    line = b"2026-11-23 12:00:00 INFO step ok loss 0.123456 lr 0.0001 " + b"." * 40 + b"\n"
    path = tmp_path / "replica-0.log"
    with path.open("wb") as f:
        block = line * 10_000
        for _ in range(60 * 1024 * 1024 // len(block)):
            f.write(block)
        f.write(b"Traceback: CUDA error: out of memory\n")
        f.write(block)
    size = path.stat().st_size
    reads = []
    real_open = type(path).open

    def counting_open(self, *args, **kw):
        handle = real_open(self, *args, **kw)
        real_read = handle.read

        def read(n=-1):
            reads.append(n)
            return real_read(n)

        handle.read = read
        return handle

    monkeypatch.setattr(type(path), "open", counting_open)
    (match,) = logs.search_log(path, "cuda ERROR")
    assert match.text == "Traceback: CUDA error: out of memory"
    assert match.line_start == size - len(block) - len(match.text) - 1
    assert max(reads) <= logs.SEARCH_CHUNK_BYTES and -1 not in reads
    (back,) = logs.search_log(path, "out of memory", before=size, limit=1)
    assert back.line_start == match.line_start


@pytest.mark.django_db
@pytest.mark.parametrize("params, field", [
    ({}, "q"), ({"q": ""}, "q"), ({"q": "x" * 201}, "q"), ({"q": "a", "limit": 0}, "limit"),
    ({"q": "a", "limit": 201}, "limit"), ({"q": "a", "after": -1}, "after"),
    ({"q": "a", "after": 1, "before": 2}, "before"), ({"q": "a", "replica": "x"}, "replica"),
])
def test_bad_search_parameters_are_400(admitted, client_for, params, field):
    write_log(admitted, 1, 0, LOG)
    assert_error_shape(client_for("bob").get(job_url(admitted.pk, "logs/search"), params), 400, field)


@pytest.mark.django_db
def test_search_of_a_missing_replica_or_log(submit, admitted, client_for):
    client = client_for("bob")
    assert client.get(job_url(admitted.pk, "logs/search"), {"q": "a", "replica": 5}).status_code == 404
    assert client.get(job_url(admitted.pk, "logs/search"), {"q": "a"}).json()["matches"] == []  # no file yet
    pending = submit("bob")
    assert client.get(job_url(pending.pk, "logs/search"), {"q": "a"}).json() == {
        "matches": [], "size": 0, "attempt": None, "replica": 0}


@pytest.mark.django_db
def test_raw_log_opens_in_a_tab_or_downloads(admitted, client_for):
    write_log(admitted, 1, 1, b"<script>alert(1)</script>\n")
    client = client_for("pan")
    response = client.get(job_url(admitted.pk, "logs/raw"), {"replica": 1}, HTTP_ACCEPT="text/html,*/*;q=0.8")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Disposition"] == f'inline; filename="job-{admitted.pk}-attempt-1-replica-1.log"'
    assert (response["X-Log-Size"], response["X-Log-Replica"]) == ("26", "1")
    assert body(response) == b"<script>alert(1)</script>\n"

    response = client.get(job_url(admitted.pk, "logs/raw"), {"replica": 1, "download": "true"})
    assert response["Content-Disposition"] == f'attachment; filename="job-{admitted.pk}-attempt-1-replica-1.log"'
    assert client.get(job_url(admitted.pk, "logs/raw"), {"replica": 2}).status_code == 404


def test_follow_step_sends_everything_or_skips_to_the_last_window(tmp_path):
    path = tmp_path / "replica-0.log"
    assert logs.follow_step(path, 0) == logs.FollowStep(b"", 0, None)
    path.write_bytes(b"a\nbb\nccc\n")
    assert logs.follow_step(path, 2, window=100) == logs.FollowStep(b"bb\nccc\n", 2, 9)
    assert logs.follow_step(path, 9, window=100) == logs.FollowStep(b"", 9, 9)
    # 7 bytes behind with a window of 5: the window's first whole line, and the bytes skipped.
    step = logs.follow_step(path, 2, window=5)
    assert (step.data, step.start, step.end, step.skipped_from) == (b"ccc\n", 5, 9, 2)
    # A line still being written is left for later when asked.
    with path.open("ab") as f:
        f.write(b"dd")
    assert logs.follow_step(path, 2, window=100, whole_lines=True) == logs.FollowStep(b"bb\nccc\n", 2, 11)
    assert logs.follow_step(path, 9, window=100, whole_lines=True) == logs.FollowStep(b"", 9, 11)
    assert logs.follow_step(path, 9, window=100) == logs.FollowStep(b"dd", 9, 11)
