"""The WebSocket consumers: authentication at the edge, permission filtering, the HTML they send (fragments of the
pages' own templates as htmx out-of-band swaps), filters, coalescing and the one-receiver-per-process fan-out."""

from __future__ import annotations

import asyncio
import re

import pytest
from django.db import transaction
from django.test import Client
from django.urls import reverse

from jobs import live_hub, live_publisher, services
from jobs.choices import Phase
from jobs.models import Attempt, Job

from .conftest import admitted, db, frames_until, pending

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def row_of(html: str, job_id: int) -> str | None:
    match = re.search(rf'<tr id="job-{job_id}"[^>]*>.*?</tr>', html, re.S)
    return match.group(0) if match else None


def page_row(username: str, world, job_id: int, query: str = "") -> str | None:
    client = Client()
    client.force_login(world.users[username])
    return row_of(client.get(reverse("jobs:list") + query).content.decode(), job_id)


def without_oob(html: str) -> str:
    return html.replace(' hx-swap-oob="true"', "")


async def test_anonymous_connections_are_closed(ws, world, submit):
    job = await db(submit, "bob")
    for path in ("/ws/jobs/", f"/ws/jobs/{job.pk}/", "/ws/utilisation/", "/ws/groups/phusers/queue/"):
        _, connected = await ws(path)
        assert connected is False, path


async def test_foreign_origin_is_refused(ws, world):
    _, connected = await ws("/ws/jobs/", world.users["bob"], origin=b"http://evil.example")
    assert connected is False


async def test_a_status_change_arrives_as_the_row_of_the_page_after_commit(ws, world, submit):
    job = await db(submit, "pan", "gpu-1", name="watched")
    bob, _ = await ws("/ws/jobs/", world.users["bob"])

    def transition_in_a_transaction():
        with transaction.atomic():
            services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.PENDING, reason="GroupQuota",
                                    message="#2 in phusers, waiting for group GPU quota 4/4", queue_position=2)

    await db(transition_in_a_transaction)
    frame = await bob.receive_from(timeout=5)
    row = row_of(frame, job.pk)
    assert row and 'hx-swap-oob="true"' in row
    assert ">Pending</span>" in row and "GroupQuota" in row and "#2 in phusers" in row
    # The very row the list page draws on a first load (the same template), swapped in by its id.
    assert without_oob(row) == await db(page_row, "bob", world, job.pk)


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


async def test_non_member_hears_nothing_superuser_everything(ws, world, submit):
    job = await db(submit, "bob", "gpu-1")
    eve, connected = await ws("/ws/jobs/", world.users["eve"])
    assert connected
    admin, _ = await ws("/ws/jobs/", world.users["admin"])
    await db(lambda: services.job_cancel(job=Job.objects.get(pk=job.pk), by=world.users["bob"]))
    frames = await frames_until(admin, lambda f: ">Cancelled</span>" in f)
    assert row_of(frames[-1], job.pk)
    assert await eve.receive_nothing(timeout=0.5)


async def test_a_new_job_is_inserted_at_the_top_of_the_first_page(ws, world, submit):
    older = await db(submit, "bob", name="older")
    bob, _ = await ws(f"/ws/jobs/?shown={older.pk}", world.users["bob"])
    new = await db(submit, "pan", name="brand-new")
    frame = await bob.receive_from(timeout=5)
    assert frame.startswith(f'<tbody hx-swap-oob="afterbegin:#job-rows"><tr id="job-{new.pk}"')
    assert "brand-new" in frame


async def test_filter_is_respected_an_ended_job_leaves_a_running_list(ws, world, submit):
    running, _ = await db(admitted, await db(submit, "bob", name="runs"))
    await db(lambda: services.job_transition(job=Job.objects.get(pk=running.pk), phase=Phase.RUNNING))
    other = await db(submit, "bob", name="waits")
    lister, _ = await ws(f"/ws/jobs/?phase=RUNNING&shown={running.pk}", world.users["bob"])

    await db(pending, other)  # not RUNNING, not shown: nothing for this page
    assert await lister.receive_nothing(timeout=0.5)
    await db(lambda: services.job_transition(job=Job.objects.get(pk=running.pk), phase=Phase.SUCCEEDED,
                                             reason="Completed", exit_code=0))
    frame = await lister.receive_from(timeout=5)
    assert frame == f'<tr id="job-{running.pk}" hx-swap-oob="delete"></tr>'
    # The unfiltered list keeps it, as Succeeded.
    assert ">Succeeded</span>" in (await db(page_row, "bob", world, running.pk))


async def test_a_job_that_comes_to_match_is_inserted_in_order(ws, world, submit):
    first, _ = await db(admitted, await db(submit, "bob", name="first"))
    middle = await db(submit, "bob", name="middle")
    last, _ = await db(admitted, await db(submit, "bob", name="last"))
    for job in (first, last):
        await db(lambda j=job: services.job_transition(job=Job.objects.get(pk=j.pk), phase=Phase.RUNNING))
    lister, _ = await ws(f"/ws/jobs/?phase=RUNNING&shown={last.pk},{first.pk}", world.users["bob"])
    await db(admitted, middle)
    await db(lambda: services.job_transition(job=Job.objects.get(pk=middle.pk), phase=Phase.RUNNING))
    frames = await frames_until(lister, lambda f: "afterend" in f)
    assert frames[-1].startswith(f'<tbody hx-swap-oob="afterend:#job-{last.pk}"><tr id="job-{middle.pk}"')


async def test_a_burst_of_changes_of_one_job_ends_in_its_last_state_in_fewer_frames(ws, world, submit):
    job, _ = await db(admitted, await db(submit, "bob", name="flapping"))
    await db(lambda: services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.RUNNING))
    bob, _ = await ws("/ws/jobs/", world.users["bob"])
    changes = 40

    def burst():
        for i in range(changes):
            status = "CrashLoopBackOff" if i % 2 == 0 else "Running"
            services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.RUNNING, status=status,
                                    reason=f"step-{i}")

    await db(burst)
    frames = await frames_until(bob, lambda f: f"step-{changes - 1}" in f)
    assert len(frames) < changes
    assert ">Running</span>" in frames[-1]
    assert await bob.receive_nothing(timeout=0.3)


async def test_one_render_per_change_whatever_the_number_of_sockets(ws, world, submit):
    job = await db(submit, "bob", name="shared")
    sockets = [(await ws(f"/ws/jobs/?shown={job.pk}", world.users[name]))[0]
               for name in ("bob", "pan", "lin", "bob", "pan", "lin")]
    await db(pending, job)
    frames = [await s.receive_from(timeout=5) for s in sockets]
    assert len(set(frames)) == 1  # the same bytes, rendered once
    assert ">Pending</span>" in frames[0]


async def test_disconnect_leaves_no_channel_in_the_layer_groups(ws, world, submit, settings):
    from channels.layers import get_channel_layer

    bob, _ = await ws("/ws/jobs/", world.users["bob"])
    admin, _ = await ws("/ws/jobs/", world.users["admin"])
    layer = get_channel_layer()
    phusers = live_publisher.group_channel(world.groups["phusers"].pk)
    assert {name for name, members in layer.groups.items() if members} >= {phusers, live_publisher.GROUP_ALL}
    assert len(layer.groups[phusers]) == 1  # the process's hub, not each socket
    await bob.disconnect()
    await admin.disconnect()
    assert not any(layer.groups.get(name) for name in (phusers, live_publisher.GROUP_ALL))


async def test_reconnect_sends_rows_that_changed_since_the_page_was_drawn(ws, world, submit):
    from django.utils import timezone

    job = await db(submit, "bob", name="changed-meanwhile")
    drawn = timezone.now()
    await db(pending, job)
    query = f"shown={job.pk}&since={drawn.isoformat()}".replace("+", "%2B")
    bob, _ = await ws(f"/ws/jobs/?{query}", world.users["bob"])
    frame = await bob.receive_from(timeout=5)
    assert frame.startswith('<tbody id="job-rows" hx-swap-oob="true">') and ">Pending</span>" in frame


async def test_page_two_counts_new_jobs_in_a_notice(ws, world, submit, monkeypatch):
    monkeypatch.setattr("jobs.views.PAGE_SIZE", 1)
    old = await db(submit, "bob", name="old")
    await db(submit, "bob", name="on-page-one")
    lister, _ = await ws(f"/ws/jobs/?page=2&shown={old.pk}", world.users["bob"])
    await db(submit, "bob", name="newer")
    frame = await lister.receive_from(timeout=5)
    assert 'id="new-jobs"' in frame and "1 new job — show" in frame


async def test_detail_socket_needs_visibility(ws, world, submit):
    job = await db(submit, "bob")
    _, connected = await ws(f"/ws/jobs/{job.pk}/", world.users["eve"])
    assert connected is False
    _, connected = await ws(f"/ws/jobs/{job.pk}/", world.users["pan"])
    assert connected is True
    _, connected = await ws("/ws/jobs/999999/", world.users["admin"])
    assert connected is False


async def test_detail_socket_redraws_its_job_and_appends_new_events(ws, world, submit):
    job = await db(submit, "bob", name="detailed")
    other = await db(submit, "bob", name="other")
    first_event = await db(lambda: job.events.order_by("id").last().pk)
    detail, _ = await ws(f"/ws/jobs/{job.pk}/?after={first_event}", world.users["pan"])
    opened = await detail.receive_from(timeout=5)  # the first draw: the page's live parts, as for every change
    assert 'id="status-card" hx-swap-oob="true"' in opened and ">Submitted</span>" in opened

    await db(pending, other)  # another job of the group: not on this socket
    await db(pending, job, 1, "GroupQuota", "waiting for quota")
    frame, events = await frames_until(detail, lambda f: "beforeend:#events tbody" in f)
    for part in ('<div class="page-head" id="job-head" hx-swap-oob="true">',
                 'id="status-card" hx-swap-oob="true"', 'id="attempts-card" hx-swap-oob="true"'):
        assert part in frame
    assert ">Pending</span>" in frame and "Cancel job" not in frame  # pan may not act on bob's job
    # Table rows travel in a frame of their own (HTML parsing keeps rows only among rows).
    assert events.startswith('<tbody hx-swap-oob="beforeend:#events tbody"><tr class="">')
    assert "GroupQuota" in events and "waiting for quota" in events and "Submitted by bob" not in events
    assert await detail.receive_nothing(timeout=0.3)

    # A page drawn before the GroupQuota event gets it when its socket opens, then what follows.
    owner, _ = await ws(f"/ws/jobs/{job.pk}/?after={first_event}", world.users["bob"])
    *_, caught_up = await frames_until(owner, lambda f: "beforeend:#events tbody" in f)
    assert caught_up.count("data-event=") == 1 and "waiting for quota" in caught_up
    await db(lambda: services.event_record(job=Job.objects.get(pk=job.pk), reason="Started", message="on local"))
    frame, events = await frames_until(owner, lambda f: "beforeend:#events tbody" in f)
    assert "Cancel job" in frame and events.count("data-event=") == 1 and "on local" in events


async def test_detail_socket_inserts_the_log_viewer_of_a_new_attempt(ws, world, submit):
    job = await db(submit, "bob", replicas=2)
    detail, _ = await ws(f"/ws/jobs/{job.pk}/?after=0", world.users["bob"])
    await db(admitted, job)
    frames = await frames_until(detail, lambda f: "afterbegin:#logs-list" in f)
    assert 'id="log-1-0"' in frames[-1] and 'id="log-1-1"' in frames[-1]
    assert '<tr id="no-events" hx-swap-oob="delete"></tr>' in frames


async def test_detail_socket_marks_a_shown_replica_that_fails_first(ws, world, submit):
    job = await db(submit, "bob", replicas=2)
    job, attempt = await db(admitted, job)
    detail, _ = await ws(f"/ws/jobs/{job.pk}/?after=0", world.users["bob"])
    await frames_until(detail, lambda f: "beforeend:#events tbody" in f)  # the events the page lacked

    def replica_1_fails():
        with transaction.atomic():  # as the scheduler records it: the attempt, then the job's change after commit
            Attempt.objects.filter(pk=attempt.pk).update(failed_rank=1, exit_code=2)
            services.event_record(job=Job.objects.get(pk=job.pk), reason="ReplicaFailed", message="rank 1 exit 2")

    await db(replica_1_fails)
    frames = await frames_until(detail, lambda f: 'id="log-1-1-failed"' in f)
    mark = re.search(r'<span id="log-1-1-failed"[^>]*>.*?</span></span>', frames[-1]).group(0)
    assert 'hx-swap-oob="true"' in mark and "failed · exit 2" in mark
    assert 'id="log-1-0-failed"' not in "".join(frames)  # the replica that did not fail is left alone
    assert 'id="log-1-1"' not in "".join(frames)  # its viewer, with the lines it shows, is not redrawn

    await db(lambda: services.event_record(job=Job.objects.get(pk=job.pk), reason="Tick", message="later"))
    frames = await frames_until(detail, lambda f: "beforeend:#events tbody" in f)
    assert 'id="log-1-1-failed"' not in "".join(frames)  # marked once


async def test_queue_socket_asks_the_page_to_refetch_its_block(ws, world, submit):
    _, connected = await ws("/ws/groups/phusers/queue/", world.users["eve"])
    assert connected is False  # not her group
    queue, _ = await ws("/ws/groups/phusers/queue/", world.users["pan"])
    await db(submit, "bob")
    await db(submit, "bob")
    frame = await queue.receive_from(timeout=5)
    assert 'hx-get="/groups/phusers/queue/"' in frame and 'hx-select="#queue-live"' in frame
    assert await queue.receive_nothing(timeout=0.7)  # coalesced


async def test_utilisation_socket_refreshes_without_job_data(ws, world, submit):
    eve, _ = await ws("/ws/utilisation/", world.users["eve"])
    await db(submit, "bob")
    await db(submit, "bob")
    frame = await eve.receive_from(timeout=5)
    assert 'hx-get="/utilisation/"' in frame and "job-" not in frame
    assert await eve.receive_nothing(timeout=0.7)


async def test_redis_layer_for_real(ws, world, submit, settings):
    import os

    url = os.environ.get("REDIS_URL")
    if not url:
        pytest.skip("REDIS_URL is not set")
    prefix = f"jobsite-test-{os.getpid()}"
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                                           "CONFIG": {"hosts": [url], "prefix": prefix}}}  # as production's
    from channels.layers import get_channel_layer

    assert type(get_channel_layer()).__name__ == "RedisPubSubChannelLayer"
    job = await db(submit, "pan")
    assert await db(live_publisher.flush, 5)  # its "Submitted" is out before the sockets open
    bob, _ = await ws(f"/ws/jobs/?shown={job.pk}", world.users["bob"])
    pan, _ = await ws(f"/ws/jobs/?shown={job.pk}", world.users["pan"])
    eve, _ = await ws("/ws/jobs/", world.users["eve"])
    await db(pending, job, 3)
    frames = [(await frames_until(s, lambda f: ">Pending</span>" in f))[-1] for s in (bob, pan)]
    assert frames[0] == frames[1]
    assert await eve.receive_nothing(timeout=0.5)
    assert await db(live_publisher.flush, 5)

    import redis

    client = redis.Redis.from_url(url)
    group_key = f"{prefix}__group__{live_publisher.group_channel(job.group_id)}"
    assert client.pubsub_numsub(group_key) == [(group_key.encode(), 1)]  # one subscriber (the hub), three sockets
    for s in (bob, pan, eve):
        await s.disconnect()
    assert client.pubsub_numsub(group_key) == [(group_key.encode(), 0)]  # nothing left behind
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
    client.close()


async def test_layer_down_never_fails_a_transition(world, submit, settings, caplog):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}}
    job = await db(submit, "bob")
    job = await db(pending, job)  # no exception
    assert job.phase == Phase.PENDING
    assert await db(live_publisher.flush, 10)
    assert "could not publish" in caplog.text


async def test_the_hub_goes_with_its_last_socket(ws, world, submit):
    bob, _ = await ws("/ws/jobs/", world.users["bob"])
    await bob.disconnect()
    assert not live_hub._hubs.get(asyncio.get_running_loop())  # the hub went with its last socket
