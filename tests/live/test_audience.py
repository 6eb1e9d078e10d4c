"""A change no page shows is neither read nor rendered nor sent (jobs.live_audience): production's layer (Redis
pub/sub) on a Redis of the test's own, the publisher thread as in a scheduler or a web process."""

from __future__ import annotations

import asyncio
import time

import pytest
from channels.layers import get_channel_layer

from jobs import live_audience, live_hub, live_publisher

from .conftest import REDIS_DEADLINE, db, frames_until, pending

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def heard_now() -> set[str]:
    return await live_audience.Audience(get_channel_layer()).groups()


async def until_heard(predicate) -> set[str]:
    """The audiences listened to, once ``predicate`` holds of them (a hub's subscription reaches Redis)."""
    deadline = time.monotonic() + REDIS_DEADLINE
    while not predicate(heard := await heard_now()):
        assert time.monotonic() < deadline, f"timed out waiting for the hub's subscription (heard: {heard})"
        await asyncio.sleep(0.02)
    return heard


async def published(change) -> tuple[int, int]:
    """Make ``change`` (in the database thread) and wait for the publisher: (rows it rendered, jobs left alone)."""
    publisher = live_publisher._publisher()
    rows, unheard = publisher.rows, publisher.unheard
    await db(change)
    assert await db(live_publisher.flush, REDIS_DEADLINE)
    return publisher.rows - rows, publisher.unheard - unheard


async def test_with_no_page_open_a_change_is_not_rendered(private_redis, world, submit):
    assert await heard_now() == set()
    rendered, unheard = await published(lambda: submit("bob", name="nobody-looks"))
    assert (rendered, unheard) == (0, 1)


async def test_a_page_gets_its_groups_rows_and_no_other_group_is_rendered(private_redis, ws, world, submit):
    phusers, other = world.groups["phusers"].pk, world.groups["other"].pk
    lister, connected = await ws("/ws/jobs/?shown=&since=2000-01-01T00:00:00%2B00:00", world.users["bob"])
    assert connected
    heard = await until_heard(lambda heard: live_publisher.group_channel(phusers) in heard)
    assert live_publisher.group_channel(other) not in heard

    rendered, unheard = await published(lambda: submit("eve", group="other", name="in-another-group"))
    assert (rendered, unheard) == (0, 0)  # asked, read, but no row drawn: no page of that group is open
    rendered, _ = await published(lambda: submit("bob", name="in-bobs-group"))
    assert rendered == 1
    frames = await frames_until(lister, lambda f: "in-bobs-group" in f)
    assert not any("in-another-group" in f for f in frames)


async def test_the_utilisation_page_alone_hears_of_a_change_without_rows(private_redis, ws, world, submit):
    job = await db(submit, "bob", name="counted")
    assert await db(live_publisher.flush, REDIS_DEADLINE)
    util, connected = await ws("/ws/utilisation/", world.users["eve"])
    assert connected
    await until_heard(lambda heard: heard == {live_publisher.UTILISATION})
    rendered, unheard = await published(lambda: pending(job, 1, "GroupQuota", "waits"))
    assert (rendered, unheard) == (0, 0)
    frame = (await frames_until(util, lambda f: "hx-get=" in f))[-1]
    assert 'hx-get="/utilisation/"' in frame


async def test_a_detail_page_hears_its_own_job_and_no_other_is_rendered(private_redis, ws, world, submit):
    job = await db(submit, "bob", name="followed")
    assert await db(live_publisher.flush, REDIS_DEADLINE)
    detail, connected = await ws(f"/ws/jobs/{job.pk}/?after=0", world.users["bob"])
    assert connected
    mine = live_publisher.job_channel(job.pk)
    assert await until_heard(lambda heard: mine in heard) == {mine}
    assert live_hub._hubs[asyncio.get_running_loop()].groups() == {mine}
    rendered, unheard = await published(lambda: submit("bob", name="beside-it"))  # its group, not its page
    assert (rendered, unheard) == (0, 0)
    rendered, _ = await published(lambda: pending(job, 1, "GroupQuota", "now pending"))
    assert rendered == 1
    frames = await frames_until(detail, lambda f: ">Pending</span>" in f)
    assert frames


async def test_an_audience_replaced_leaves_no_connection_open(private_redis):
    import redis

    admin = redis.Redis.from_url(private_redis.url)
    before = admin.info("clients")["connected_clients"]
    audience = live_audience.Audience(get_channel_layer())
    assert await audience.groups() == set()
    assert admin.info("clients")["connected_clients"] == before + 1
    await audience.close()
    deadline = time.monotonic() + REDIS_DEADLINE
    while admin.info("clients")["connected_clients"] != before:
        assert time.monotonic() < deadline, "the audience's connection stayed open"
        await asyncio.sleep(0.02)


async def test_gpu_readings_go_only_to_the_detail_pages_open(private_redis, ws, world, submit, monkeypatch):
    followed, other = await db(submit, "bob", name="followed"), await db(submit, "bob", name="not-followed")
    assert await db(live_publisher.flush, REDIS_DEADLINE)
    detail, connected = await ws(f"/ws/jobs/{followed.pk}/?after=0", world.users["bob"])
    assert connected
    mine = live_publisher.job_channel(followed.pk)
    await until_heard(lambda heard: mine in heard)
    sent: list[list[str]] = []
    send_all = live_publisher._send_all

    async def recorded(layer, sends):
        sent.append([name for name, _ in sends])
        await send_all(layer, sends)

    monkeypatch.setattr(live_publisher, "_send_all", recorded)
    live_publisher.publish_gpu_changes([followed.pk, other.pk])
    deadline = time.monotonic() + REDIS_DEADLINE
    while not sent:
        assert time.monotonic() < deadline, "the readings were never sent"
        await asyncio.sleep(0.02)
    assert sent == [[mine]]  # one message a running job, to the pages heard only
