"""The WebSocket consumers: authentication at the edge, permission filtering, message shape, detail streams."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from django.db import transaction

from jobs import services
from jobs.choices import Phase
from jobs.models import Job

from .conftest import admitted, pending

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

JOB_UPDATED_KEYS = {
    "type", "id", "phase", "status", "color", "color_name", "reason", "message", "queue_position", "updated_at",
    "group", "user", "name", "over_quota", "exit_code", "started_at", "finished_at", "created_at", "admitted_at",
    "phase_label", "instance_type", "replicas", "gpu", "job_type", "attempt", "estimated_start", "estimate_basis",
    "estimate",
}


def db(fn, *args, **kwargs):
    return database_sync_to_async(fn)(*args, **kwargs)


async def next_for(communicator, job_id: int, timeout: float = 3) -> dict:
    """The next job.updated message about ``job_id`` (skipping others)."""
    while True:
        message = await communicator.receive_json_from(timeout=timeout)
        if message.get("id") == job_id and message["type"] == "job.updated":
            return message


async def test_anonymous_connections_are_closed(ws, world, submit):
    job = await db(submit, "bob")
    for path in ("/ws/jobs/", f"/ws/jobs/{job.pk}/", "/ws/utilisation/"):
        _, connected = await ws(path)
        assert connected is False, path


async def test_foreign_origin_is_refused(ws, world):
    _, connected = await ws("/ws/jobs/", world.users["bob"], origin=b"http://evil.example")
    assert connected is False


async def test_member_receives_job_updated_after_commit(ws, world, submit):
    bob, _ = await ws("/ws/jobs/", world.users["bob"])
    pan, _ = await ws("/ws/jobs/", world.users["pan"])

    job = await db(submit, "pan", "gpu-1", name="watched")  # a new job: the list shows it
    created = await next_for(bob, job.pk)
    assert (created["phase"], created["status"], created["color_name"]) == ("SUBMITTED", "Submitted", "orange")
    await next_for(pan, job.pk)

    def transition_in_a_transaction():
        with transaction.atomic():
            services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.PENDING, reason="GroupQuota",
                                    message="#2 in phusers, waiting for group GPU quota 4/4", queue_position=2)
            # Nothing is sent while the transaction is open.
            assert not hasattr(transition_in_a_transaction, "sent")

    await db(transition_in_a_transaction)
    message = await next_for(bob, job.pk)
    assert set(message) == JOB_UPDATED_KEYS
    assert message["type"] == "job.updated"
    assert message["id"] == job.pk and message["name"] == "watched"
    assert (message["group"], message["user"]) == ("phusers", "pan")
    assert (message["phase"], message["status"], message["reason"]) == ("PENDING", "Pending", "GroupQuota")
    assert (message["color"], message["color_name"]) == ("#fd8608", "orange")
    assert message["queue_position"] == 2
    assert message["message"] == "#2 in phusers, waiting for group GPU quota 4/4"
    assert message["over_quota"] is False and message["exit_code"] is None
    assert message["started_at"] is None and message["finished_at"] is None
    assert message["updated_at"].startswith(str(job.created_at.year))
    assert (await next_for(pan, job.pk))["phase"] == "PENDING"


async def test_rolled_back_transition_sends_nothing(ws, world, submit):
    job = await db(submit, "bob")
    bob, _ = await ws("/ws/jobs/", world.users["bob"])

    def rolled_back():
        try:
            with transaction.atomic():
                pending(job)
                raise RuntimeError("boom")
        except RuntimeError:
            pass

    await db(rolled_back)
    assert await bob.receive_nothing(timeout=0.3)


async def test_non_member_receives_nothing_superuser_everything(ws, world, submit):
    eve, connected = await ws("/ws/jobs/", world.users["eve"])
    assert connected
    admin, _ = await ws("/ws/jobs/", world.users["admin"])

    job = await db(submit, "bob", "gpu-1")
    await db(pending, job)
    await db(admitted, job)
    await db(lambda: services.job_cancel(job=Job.objects.get(pk=job.pk), by=world.users["bob"]))

    phases = []
    while len(phases) < 5:
        phases.append((await next_for(admin, job.pk))["phase"])
    assert phases[0] == "SUBMITTED" and "PREPARING" in phases and phases[-1] == "TERMINATING"
    assert await eve.receive_nothing(timeout=0.5)


async def test_eve_hears_about_her_own_group_only(ws, world, submit):
    eve, _ = await ws("/ws/jobs/", world.users["eve"])
    await db(submit, "bob")
    own = await db(submit, "eve", group="other")
    message = await eve.receive_json_from(timeout=3)
    assert (message["id"], message["group"]) == (own.pk, "other")
    assert await eve.receive_nothing(timeout=0.3)


async def test_queue_info_update_sends_one_message_per_job(ws, world, submit):
    jobs = [await db(submit, "bob") for _ in range(3)]
    for job in jobs:
        await db(pending, job, 5)
    bob, _ = await ws("/ws/jobs/", world.users["bob"])

    def refresh():
        with transaction.atomic():
            services.job_queue_info_update({jobs[0].pk: ("#1 now", 1), jobs[2].pk: ("#2 now", 2)})

    await db(refresh)
    got = {}
    for _ in range(2):
        message = await bob.receive_json_from(timeout=3)
        got[message["id"]] = (message["queue_position"], message["message"])
    assert got == {jobs[0].pk: (1, "#1 now"), jobs[2].pk: (2, "#2 now")}
    assert await bob.receive_nothing(timeout=0.3)


async def test_detail_socket_needs_visibility(ws, world, submit):
    job = await db(submit, "bob")
    _, connected = await ws(f"/ws/jobs/{job.pk}/", world.users["eve"])
    assert connected is False
    _, connected = await ws(f"/ws/jobs/{job.pk}/", world.users["pan"])
    assert connected is True
    _, connected = await ws("/ws/jobs/999999/", world.users["admin"])
    assert connected is False


async def test_detail_socket_streams_its_job_and_new_events(ws, world, submit):
    job = await db(submit, "bob", name="detailed")
    other = await db(submit, "bob", name="other")
    detail, _ = await ws(f"/ws/jobs/{job.pk}/", world.users["pan"])

    first_event = await db(lambda: job.events.order_by("id").first().pk)
    await detail.send_json_to({"type": "events.since", "after": 0})
    caught_up = await detail.receive_json_from(timeout=3)
    assert caught_up["type"] == "event.created"
    assert (caught_up["id"], caught_up["reason"], caught_up["event_type"]) == (first_event, "Submitted", "Normal")
    assert caught_up["message"] == "Submitted by bob to phusers" and caught_up["time_display"]

    await db(pending, other)  # another job of the group: not on this socket
    await db(pending, job, 1, "GroupQuota", "waiting for quota")
    updated = await detail.receive_json_from(timeout=3)
    assert (updated["type"], updated["id"], updated["phase"]) == ("job.updated", job.pk, "PENDING")
    event = await detail.receive_json_from(timeout=3)
    assert event["type"] == "event.created" and event["reason"] == "GroupQuota"
    assert event["message"] == "waiting for quota"
    assert await detail.receive_nothing(timeout=0.3)


async def test_an_event_without_a_transition_reaches_the_detail_page(ws, world, submit):
    job = await db(submit, "bob", name="evented")
    detail, _ = await ws(f"/ws/jobs/{job.pk}/", world.users["bob"])
    await detail.send_json_to({"type": "events.since", "after": 0})
    assert (await detail.receive_json_from(timeout=3))["reason"] == "Submitted"

    def record():
        with transaction.atomic():
            services.event_record(job=job, reason="Started", message="Started 1 replica(s) on local")

    await db(record)
    messages = [await detail.receive_json_from(timeout=3) for _ in range(2)]
    started = [m for m in messages if m["type"] == "event.created"]
    assert [m["reason"] for m in started] == ["Started"]


async def test_detail_socket_follows_a_log_file(ws, world, submit):
    from scheduler.backends import get_backend

    job = await db(submit, "bob", replicas=2)
    job, attempt = await db(admitted, job)
    path = get_backend("local").log_path(job_id=job.pk, attempt_number=attempt.number, rank=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"already shown\n")
    offset = path.stat().st_size

    detail, _ = await ws(f"/ws/jobs/{job.pk}/", world.users["bob"])
    await detail.send_json_to({"type": "log.follow", "attempt": attempt.number, "rank": 1, "offset": offset})
    assert await detail.receive_nothing(timeout=0.2)  # nothing new yet

    line = b"\x1b[32mepoch 1\x1b[0m loss 0.5\n"
    with path.open("ab") as f:
        f.write(line)
    appended = await detail.receive_json_from(timeout=3)
    assert appended == {"type": "log.appended", "attempt": 1, "rank": 1, "offset": offset,
                        "end": offset + len(line), "text": line.decode()}

    # A UTF-8 character split between two writes arrives whole.
    with path.open("ab") as f:
        f.write("naïve ".encode()[:3])
        f.flush()
        await asyncio.sleep(0.2)
        f.write("naïve ".encode()[3:] + b"done\n")
    text = ""
    while "done" not in text:
        text += (await detail.receive_json_from(timeout=3))["text"]
    assert text == "naïve done\n"

    await detail.send_json_to({"type": "log.unfollow", "attempt": 1, "rank": 1})
    await asyncio.sleep(0.2)
    with path.open("ab") as f:
        f.write(b"not followed\n")
    assert await detail.receive_nothing(timeout=0.3)

    await detail.send_json_to({"type": "log.follow", "attempt": 1, "rank": 7, "offset": 0})  # no such replica
    assert (await detail.receive_json_from(timeout=3))["type"] == "log.error"


async def test_utilisation_socket_pings_without_job_data(ws, world, submit):
    eve, _ = await ws("/ws/utilisation/", world.users["eve"])
    await db(submit, "bob")
    await db(submit, "bob")
    assert await eve.receive_json_from(timeout=3) == {"type": "utilisation.changed"}  # coalesced
    assert await eve.receive_nothing(timeout=0.7)


async def test_redis_layer_for_real(ws, world, submit, settings):
    import os

    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("REDIS_URL is not set")
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": [url], "prefix": f"jobsite-test-{os.getpid()}"}}}
    from channels.layers import get_channel_layer

    from jobs import realtime

    assert type(get_channel_layer()).__name__ == "RedisChannelLayer"
    bob, _ = await ws("/ws/jobs/", world.users["bob"])
    eve, _ = await ws("/ws/jobs/", world.users["eve"])
    job = await db(submit, "pan")
    await db(pending, job, 3)
    assert (await next_for(bob, job.pk))["phase"] == "SUBMITTED"
    message = await next_for(bob, job.pk)
    assert (message["phase"], message["queue_position"], message["color_name"]) == ("PENDING", 3, "orange")
    assert await eve.receive_nothing(timeout=0.5)
    assert await db(realtime.flush, 5)
    import redis

    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"jobsite-test-{os.getpid()}*"):
        client.delete(key)
    client.close()


async def test_layer_down_never_fails_a_transition(world, submit, settings, caplog):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}}
    from jobs import realtime

    job = await db(submit, "bob")
    job = await db(pending, job)  # no exception
    assert job.phase == Phase.PENDING
    assert await db(realtime.flush, 10)
    assert "could not publish" in caplog.text
