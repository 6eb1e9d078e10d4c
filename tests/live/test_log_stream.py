"""``ws/jobs/<id>/logs/``: the log viewer's stream. One piece in flight per log until the viewer acknowledges it;
a viewer that fell behind gets the newest window and a note of the bytes skipped."""

from __future__ import annotations

import pytest

from jobs import logs, services
from jobs.choices import Phase
from jobs.models import Job

from .conftest import admitted, db

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def log_file(submit, **kw):
    from scheduler.backend_factory import get_backend

    job = await db(submit, "bob", **kw)
    job, attempt = await db(admitted, job)
    path = get_backend("local").log_path(job_id=job.pk, attempt_number=attempt.number, rank=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return job, attempt, path


async def next_of(communicator, kind: str) -> dict:
    while True:
        message = await communicator.receive_json_from(timeout=5)
        if message["type"] == kind:
            return message


async def test_the_log_socket_needs_visibility(ws, world, submit):
    job, _, _ = await log_file(submit)
    _, connected = await ws(f"/ws/jobs/{job.pk}/logs/", world.users["eve"])  # not in bob's group
    assert not connected
    _, connected = await ws(f"/ws/jobs/{job.pk}/logs/")
    assert not connected


async def test_a_viewer_behind_gets_the_tail_and_a_skip_note(ws, world, submit):
    job, attempt, path = await log_file(submit)
    line = b"x" * 99 + b"\n"
    path.write_bytes(line * 30_000)  # 3 MB, far more than a window
    size = path.stat().st_size

    stream, connected = await ws(f"/ws/jobs/{job.pk}/logs/", world.users["bob"])
    assert connected
    assert (await stream.receive_json_from(timeout=5)) == {"type": "job.phase", "phase": job.phase,
                                                           "finished": False}
    await stream.send_json_to({"type": "log.follow", "attempt": attempt.number, "rank": 0, "offset": 100})
    skipped = await stream.receive_json_from(timeout=5)
    tail_start = size - logs.FOLLOW_TAIL_BYTES
    tail_start += -tail_start % 100  # the next line boundary
    assert skipped == {"type": "log.skipped", "attempt": 1, "rank": 0, "from": 100, "to": tail_start, "size": size}
    appended = await stream.receive_json_from(timeout=5)
    assert (appended["offset"], appended["end"], appended["size"]) == (tail_start, size, size)
    assert appended["text"] == (line * ((size - tail_start) // 100)).decode()

    # Until the viewer says it has shown that piece, nothing more is sent, however much the log grows.
    with path.open("ab") as f:
        f.write(b"newest line\n")
    assert await stream.receive_nothing(timeout=0.3)
    await stream.send_json_to({"type": "log.ack", "attempt": 1, "rank": 0, "end": size})
    appended = await next_of(stream, "log.appended")
    assert (appended["offset"], appended["text"]) == (size, "newest line\n")

    # A viewer keeping up gets every byte, no skip.
    await stream.send_json_to({"type": "log.ack", "attempt": 1, "rank": 0, "end": appended["end"]})
    with path.open("ab") as f:
        f.write(line * 100)
    appended = await stream.receive_json_from(timeout=5)
    assert appended["type"] == "log.appended" and appended["text"] == (line * 100).decode()


async def test_the_socket_says_when_the_job_ends(ws, world, submit):
    job, attempt, path = await log_file(submit)
    stream, _ = await ws(f"/ws/jobs/{job.pk}/logs/", world.users["bob"])
    assert (await stream.receive_json_from(timeout=5))["finished"] is False

    await db(lambda: services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.SUCCEEDED,
                                             reason="Completed", message="done"))
    assert (await next_of(stream, "job.phase")) == {"type": "job.phase", "phase": Phase.SUCCEEDED, "finished": True}


async def test_unfollow_and_unknown_replicas(ws, world, submit):
    job, attempt, path = await log_file(submit)
    stream, _ = await ws(f"/ws/jobs/{job.pk}/logs/", world.users["bob"])
    await next_of(stream, "job.phase")
    await stream.send_json_to({"type": "log.follow", "attempt": 1, "rank": 0, "offset": 0})
    await stream.send_json_to({"type": "log.unfollow", "attempt": 1, "rank": 0})
    await stream.send_json_to({"type": "log.follow", "attempt": 1, "rank": 5, "offset": 0})  # no such replica
    # Messages are handled in order: once this answer comes, the unfollow has been handled.
    assert (await stream.receive_json_from(timeout=5))["type"] == "log.error"
    with path.open("ab") as f:
        f.write(b"not followed\n")
    assert await stream.receive_nothing(timeout=0.3)
