"""The job list's frames are made once per flush for the sockets whose pages are alike, and each socket's page
state still follows its own page."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs.live_list import JobsConsumer

pytestmark = pytest.mark.fast


def page(hub, shown: set[int], params: str = "", page_number: int = 1) -> JobsConsumer:
    consumer = JobsConsumer()
    consumer.hub, consumer.params, consumer.page, consumer.page_size = hub, params, page_number, 50
    consumer.shown, consumer.new_count, consumer.first_page_url = set(shown), 0, "/"
    return consumer


def row(job_id: int, status: str) -> dict:
    return {"id": job_id, "at": f"2026-01-01T00:00:0{job_id}", "row": f'<tr id="job-{job_id}"><td>{status}</td></tr>'}


def test_alike_pages_share_one_frame_and_keep_their_own_state():
    hub = SimpleNamespace(frames={})
    first, second = page(hub, {1, 2}), page(hub, {1, 2})
    items = {2: row(2, "Running"), 3: row(3, "Pending")}
    frames = first.list_update(items, None)
    assert second.list_update(dict(items), None) is frames  # made once
    assert frames[0] == '<tr id="job-2" hx-swap-oob="true"><td>Running</td></tr>'
    assert 'afterbegin:#job-rows' in frames[1] and "job-3" in frames[1]
    assert first.shown == second.shown == {1, 2, 3}
    first.shown.discard(1)
    assert second.shown == {1, 2, 3}  # each socket keeps its own set


def test_pages_that_differ_get_their_own_frames():
    hub = SimpleNamespace(frames={})
    showing, not_showing = page(hub, {1, 2}), page(hub, {1})
    other_page = page(hub, {1, 2}, page_number=2)
    items = {2: row(2, "Failed")}
    assert showing.list_update(items, None)[0] == '<tr id="job-2" hx-swap-oob="true"><td>Failed</td></tr>'
    inserted = not_showing.list_update(items, None)
    assert inserted[0] == "" and "afterbegin:#job-rows" in inserted[1]
    assert not_showing.shown == {1, 2}
    # Filters that no longer keep the job: deleted from the page showing it.
    filtered = page(hub, {1, 2}, params="phase=PENDING")
    assert filtered.list_update(items, set())[0] == '<tr id="job-2" hx-swap-oob="delete"></tr>'
    assert filtered.shown == {1}
    assert other_page.list_update(items, None)[0].startswith('<tr id="job-2"')


def test_a_newer_state_of_a_job_is_not_answered_with_an_older_frame():
    hub = SimpleNamespace(frames={})
    first, second = page(hub, {2}), page(hub, {2})
    first.list_update({2: row(2, "Running")}, None)
    frames = second.list_update({2: {**row(2, "Failed")}}, None)
    assert "Failed" in frames[0]
