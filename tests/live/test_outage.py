"""Live pages catch up after the channel layer was away (jobs/catchup.py), without a reload or a reconnect.

Production's layer (Redis pub/sub) on a Redis of the test's own (``redis-server`` on a free port, killed and
started again); the machine's shared Redis is never touched."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import catchup, live_hub, live_publisher, services
from jobs.models import Job
from tests.waiting import async_wait_for

from .conftest import db, frames_until, pending

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

DEADLINE = 60.0  # generous: a busy two-core machine


def the_hub() -> live_hub.Hub:
    return live_hub._hubs[asyncio.get_running_loop()]


def drawn_now() -> str:
    """The ``since`` of a page drawn after its jobs' last change (a change within 2 s of it is sent again on
    connect: later than that)."""
    return (timezone.now() + timedelta(seconds=3)).isoformat().replace("+", "%2B")


def no_resend(monkeypatch) -> None:
    """Publishes that fail are not sent again: only the hub's catch-up can bring the change."""
    monkeypatch.setattr(catchup.Resend, "failed", lambda self, ids: "not sent again (test)")


async def test_pages_catch_up_after_redis_was_down_without_reconnecting(private_redis, ws, world, submit,
                                                                        monkeypatch):
    no_resend(monkeypatch)
    job = await db(submit, "bob", name="through-the-outage")
    assert await db(live_publisher.flush, 10)
    first_event = await db(lambda: job.events.order_by("id").last().pk)
    lister, connected = await ws(f"/ws/jobs/?shown={job.pk}&since={drawn_now()}", world.users["bob"])
    assert connected
    other_lister, _ = await ws(f"/ws/jobs/?shown={job.pk}&since={drawn_now()}", world.users["lin"])
    detail, _ = await ws(f"/ws/jobs/{job.pk}/?after={first_event}", world.users["bob"])
    queue, _ = await ws("/ws/groups/phusers/queue/", world.users["pan"])
    hub = the_hub()
    await async_wait_for(lambda: hub.watch.pings > 0 and hub.watch.gap is None, timeout=DEADLINE,
                         message="a ping to come back")

    private_redis.stop()
    await async_wait_for(lambda: hub.watch.gap is not None, timeout=DEADLINE, message="the hub to notice the outage")
    await db(pending, job, 1, "GroupQuota", "changed during the outage")
    assert await db(live_publisher.flush, 10)  # tried, failed, never raised
    assert (await db(Job.objects.get, pk=job.pk)).phase == "PENDING"
    assert await lister.receive_nothing(timeout=0.3)
    drawn = []
    render_rows = live_publisher.render_rows
    monkeypatch.setattr(live_publisher, "render_rows",
                        lambda ids, *heard: drawn.extend(ids) or render_rows(ids, *heard))

    private_redis.start()
    frames = await frames_until(lister, lambda f: "changed during the outage" in f)
    # The reconnect path's redraw of the page's rows, on the socket that stayed open.
    assert frames[-1].startswith('<tbody id="job-rows" hx-swap-oob="true">') and ">Pending</span>" in frames[-1]
    assert (await frames_until(other_lister, lambda f: "changed during the outage" in f))[-1] == frames[-1]
    assert drawn == [job.pk]  # drawn once for both pages
    frames = await frames_until(detail, lambda f: "beforeend:#events tbody" in f)
    assert any('id="status-card" hx-swap-oob="true"' in f and ">Pending</span>" in f for f in frames)
    assert "changed during the outage" in frames[-1]
    frame = (await frames_until(queue, lambda f: "hx-get=" in f))[-1]
    assert 'hx-get="/groups/phusers/queue/"' in frame
    assert hub.watch.outages >= 1 and the_hub() is hub

    # Live again, message by message: the hub's subscription is back.
    await db(lambda: services.job_cancel(job=Job.objects.get(pk=job.pk), by=world.users["bob"]))
    frames = await frames_until(lister, lambda f: ">Cancelled</span>" in f)
    assert frames[-1].startswith(f'<tr id="job-{job.pk}"')


async def test_a_socket_opened_during_the_outage_is_accepted_and_catches_up(private_redis, ws, world, submit,
                                                                           monkeypatch):
    no_resend(monkeypatch)
    job = await db(submit, "bob", name="opened-late")
    assert await db(live_publisher.flush, 10)
    detail, _ = await ws(f"/ws/jobs/{job.pk}/?after=0", world.users["bob"])  # the hub's channel exists
    hub = the_hub()
    await async_wait_for(lambda: hub.watch.pings > 0 and hub.watch.gap is None, timeout=DEADLINE,
                         message="a ping to come back")

    private_redis.stop()
    # This page's group is not joined yet: joining fails while Redis is down.
    lister, connected = await ws(f"/ws/jobs/?shown={job.pk}&since={drawn_now()}", world.users["bob"])
    assert connected
    await async_wait_for(lambda: hub.watch.gap is not None, timeout=DEADLINE, message="the hub to notice the outage")
    await db(pending, job, 1, "GroupQuota", "changed while it opened")
    assert await db(live_publisher.flush, 10)

    private_redis.start()
    frames = await frames_until(lister, lambda f: "changed while it opened" in f)
    assert frames[-1].startswith('<tbody id="job-rows" hx-swap-oob="true">')
    await db(lambda: services.job_cancel(job=Job.objects.get(pk=job.pk), by=world.users["bob"]))
    frames = await frames_until(lister, lambda f: ">Cancelled</span>" in f)  # the group was joined again
    assert frames[-1].startswith(f'<tr id="job-{job.pk}"')


async def test_a_publisher_cut_off_alone_sends_its_changes_again(private_redis, ws, world, submit, monkeypatch,
                                                                caplog):
    """The web process kept the layer (its hub saw no gap); the process that published could not reach it."""
    job = await db(submit, "bob", name="sent-again")
    assert await db(live_publisher.flush, 10)
    publisher = live_publisher._publisher()
    monkeypatch.setattr(publisher, "resend", catchup.Resend(publisher))  # no backoff left from an earlier test
    lister, _ = await ws(f"/ws/jobs/?shown={job.pk}&since={drawn_now()}", world.users["bob"])
    cut_off = True
    send_all = live_publisher._send_all

    async def publisher_send_all(layer, sends):
        if cut_off:
            raise ConnectionError("this publisher cannot reach Redis (test)")
        await send_all(layer, sends)

    monkeypatch.setattr(live_publisher, "_send_all", publisher_send_all)
    await db(pending, job, 1, "GroupQuota", "published while cut off")
    assert await db(live_publisher.flush, 10)
    await async_wait_for(lambda: "could not publish job changes" in caplog.text, timeout=DEADLINE,
                         message="the publish to fail")
    assert await lister.receive_nothing(timeout=0.3)

    cut_off = False
    # Its row, sent again (not a catch-up's redraw of the page: the hub saw no gap).
    frames = await frames_until(lister, lambda f: f.startswith(f'<tr id="job-{job.pk}" ') and "while cut off" in f)
    assert ">Pending</span>" in frames[-1]
