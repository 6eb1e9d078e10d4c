"""Messages between processes over the channel layer are authenticated (jobs/channel_auth.py): on the real Redis
layer, what anything else puts on a group's channel (unsigned, wrongly signed, another installation's) changes
nothing a socket receives and is counted in /metrics, while jobsite's own changes still arrive; and two
installations on one Redis never hear each other."""

from __future__ import annotations

import os
import time

import pytest
import redis
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

from jobs import channel_auth, live_publisher

from .conftest import db, frames_until, pending

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

OTHER = {"JOBSITE_INSTALLATION_ID": "other-installation", "SECRET_KEY": "another-installations-key-" + "k" * 30}


@pytest.fixture
def redis_url(settings):
    """Production's layer: Redis pub/sub under this installation's prefix (the test process's own id)."""
    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("REDIS_URL is not set")
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                                           "CONFIG": {"hosts": [url], "prefix": settings.JOBSITE_REDIS_PREFIX + "ws:"}}}
    settings.JOBSITE_METRICS_TOKEN = "metrics-test-token"
    return url


def rejected() -> dict[str, float]:
    """jobsite_channel_messages_rejected_total by reason, as the web's /metrics reports it."""
    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer metrics-test-token")
    assert response.status_code == 200
    return {s.labels["reason"]: s.value for family in text_string_to_metric_families(response.content.decode())
            for s in family.samples if s.name == "jobsite_channel_messages_rejected_total"}


def forged_item(job, text: str) -> dict:
    """The row the attack of issue 20 swapped into another user's page: it cancels the job as soon as it loads.
    Far in the future, so it would win over any real row of the same job."""
    row = (f'<tr id="job-{job.pk}"><td hx-post="/jobs/{job.pk}/cancel/" hx-trigger="load">{text}</td></tr>')
    return {"id": job.pk, "group_id": job.group_id, "phase": "RUNNING", "at": time.time() + 10**6, "row": row}


async def test_forged_messages_on_a_group_change_no_socket_and_are_counted(ws, world, submit, redis_url, settings):
    job = await db(submit, "lin", name="lins-job")
    assert await db(live_publisher.flush, 5)
    lin, connected = await ws(f"/ws/jobs/?shown={job.pk}", world.users["lin"])
    assert connected
    before = await db(rejected)
    group = live_publisher.group_channel(job.group_id)

    # Anything that reaches Redis: a layer of its own on the same prefix, sending straight to the group.
    attacker = RedisPubSubChannelLayer(hosts=[redis_url], prefix=settings.JOBSITE_REDIS_PREFIX + "ws:")
    try:
        unsigned = {"type": "jobs.changed", "group": group, "items": [forged_item(job, "FORGED-UNSIGNED")]}
        await attacker.group_send(group, unsigned)
        guessed = {**unsigned, "items": [forged_item(job, "FORGED-GUESSED")], "sig": "0" * 64,
                   "installation": settings.JOBSITE_INSTALLATION_ID, "sent_at": time.time()}
        await attacker.group_send(group, guessed)
        # A real signature of this installation's, on a message changed afterwards.
        genuine = await db(lambda: live_publisher.change_messages(live_publisher.render_rows([job.pk]))[0][1])
        await attacker.group_send(group, {**genuine, "items": [forged_item(job, "FORGED-TAMPERED")]})
        # Signed with a key of someone else's.
        with override_settings(SECRET_KEY=OTHER["SECRET_KEY"]):
            other_key = channel_auth.sign({"type": "jobs.changed", "group": group,
                                           "items": [forged_item(job, "FORGED-OTHER-KEY")]})
        await attacker.group_send(group, other_key)
    finally:
        await attacker.flush()

    # jobsite's own change after them: it arrives, and nothing forged came before or with it.
    await db(pending, job, 2)
    frames = await frames_until(lin, lambda f: ">Pending</span>" in f or "FORGED" in f)
    assert not [f for f in frames if "FORGED" in f or "hx-trigger" in f]
    assert f'id="job-{job.pk}"' in frames[-1]

    after = await db(rejected)
    assert after["unsigned"] - before["unsigned"] == 1
    assert after["bad_signature"] - before["bad_signature"] == 3


async def test_two_installations_on_one_redis_never_hear_each_other(ws, world, submit, redis_url, settings):
    job = await db(submit, "bob", name="ours")
    assert await db(live_publisher.flush, 5)
    bob, _ = await ws(f"/ws/jobs/?shown={job.pk}", world.users["bob"])
    group = live_publisher.group_channel(job.group_id)  # the other installation has a group of the same id
    before = await db(rejected)

    # The other installation publishes a change of "its" job of the same id, as its own publisher would.
    with override_settings(**OTHER):
        theirs = channel_auth.sign({"type": "jobs.changed", "group": group,
                                    "items": [forged_item(job, "FROM-THE-OTHER-INSTALLATION")]})
    other_prefix = f"jobsite:{OTHER['JOBSITE_INSTALLATION_ID']}:ws:"
    spy = redis.Redis.from_url(redis_url).pubsub()
    spy.subscribe(f"{other_prefix}__group__{group}")
    assert spy.get_message(timeout=5)["type"] == "subscribe"
    other = RedisPubSubChannelLayer(hosts=[redis_url], prefix=other_prefix)
    same_prefix = RedisPubSubChannelLayer(hosts=[redis_url], prefix=settings.JOBSITE_REDIS_PREFIX + "ws:")
    try:
        await other.group_send(group, theirs)
        # It went out on Redis, on the other installation's channel...
        got = await db(lambda: spy.get_message(timeout=5))
        assert got and got["type"] == "message"
        # ... and even put on ours (two installations sharing one prefix by mistake) it is not accepted.
        await same_prefix.group_send(group, theirs)
    finally:
        await other.flush()
        await same_prefix.flush()
        spy.close()

    await db(pending, job, 1)
    frames = await frames_until(bob, lambda f: ">Pending</span>" in f or "FROM-THE-OTHER" in f)
    assert not [f for f in frames if "FROM-THE-OTHER-INSTALLATION" in f]
    after = await db(rejected)
    assert after["bad_signature"] - before["bad_signature"] == 1


async def test_messages_are_signed_over_everything_the_hub_reads(world, submit, settings):
    job = await db(submit, "bob")
    sends = await db(lambda: live_publisher.change_messages(live_publisher.render_rows([job.pk])))
    for _, message in sends:
        assert channel_auth.rejection(message) is None
        assert message["installation"] == settings.JOBSITE_INSTALLATION_ID
        for field, value in (("group", "jobs.group.999"), ("type", "jobs.other"), ("items", [{"id": 1}]),
                             ("installation", "elsewhere"), ("sent_at", message["sent_at"] - 1)):
            assert channel_auth.rejection({**message, field: value}) == "bad_signature", field
    message = sends[0][1]
    assert channel_auth.rejection({k: v for k, v in message.items() if k != "sig"}) == "unsigned"
    # Replayed later than JOBSITE_CHANNEL_MESSAGE_MAX_AGE_SECONDS: stale.
    late = message["sent_at"] + settings.JOBSITE_CHANNEL_MESSAGE_MAX_AGE_SECONDS + 1
    assert channel_auth.rejection(message, now=late) == "stale"
