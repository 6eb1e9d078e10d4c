"""A socket that (re)connects catches up from the changes its process heard (the hub's ring), not from the
database, when the ring reaches back to when its page was drawn; otherwise it reads the page again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import catchup, live_hub

from .conftest import db, pending

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def query(job_id: int, drawn) -> str:
    return f"/ws/jobs/?shown={job_id}&since={drawn.isoformat()}".replace("+", "%2B")


async def heard(listener, job_id: int, text: str) -> None:
    while True:
        frame = await listener.receive_from(timeout=10)
        if f'id="job-{job_id}"' in frame and text in frame:
            return


async def test_a_reconnect_is_brought_up_to_date_from_what_the_process_heard(ws, world, submit, monkeypatch):
    monkeypatch.setattr(catchup, "MARGIN", timedelta(0))
    job = await db(submit, "bob", name="heard")
    listener, _ = await ws("/ws/jobs/", world.users["pan"])  # the process listens to phusers from now on
    drawn = timezone.now()
    await db(pending, job)
    await heard(listener, job.pk, ">Pending</span>")
    bob, _ = await ws(query(job.pk, drawn), world.users["bob"])
    frame = await bob.receive_from(timeout=10)
    # The row as it was heard, swapped in by its id (a page read again would be one <tbody> of all its rows).
    assert frame.startswith(f'<tr id="job-{job.pk}" ') and 'hx-swap-oob="true"' in frame.split(">")[0]
    assert ">Pending</span>" in frame


async def test_changes_from_before_the_process_listened_are_read_from_the_database(ws, world, submit, monkeypatch):
    monkeypatch.setattr(catchup, "MARGIN", timedelta(0))
    job = await db(submit, "bob", name="unheard")
    drawn = timezone.now()
    await db(pending, job)  # nobody listens: the process hears nothing of it
    listener, _ = await ws("/ws/jobs/", world.users["pan"])
    bob, _ = await ws(query(job.pk, drawn), world.users["bob"])
    frame = await bob.receive_from(timeout=10)
    assert frame.startswith('<tbody id="job-rows" hx-swap-oob="true">') and ">Pending</span>" in frame


async def test_a_ring_that_no_longer_reaches_back_falls_back_to_the_database(ws, world, submit, monkeypatch):
    monkeypatch.setattr(catchup, "MARGIN", timedelta(0))
    monkeypatch.setattr(live_hub, "RING_SIZE", 1)
    job = await db(submit, "bob", name="overflowed")
    other = await db(submit, "pan", name="other")
    listener, _ = await ws("/ws/jobs/", world.users["pan"])
    drawn = timezone.now()
    await db(pending, job)
    await heard(listener, job.pk, ">Pending</span>")
    await db(pending, other)
    await heard(listener, other.pk, ">Pending</span>")
    bob, _ = await ws(query(job.pk, drawn), world.users["bob"])
    frame = await bob.receive_from(timeout=10)
    assert frame.startswith('<tbody id="job-rows" hx-swap-oob="true">') and ">Pending</span>" in frame
