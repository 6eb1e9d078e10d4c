"""Which audiences a change is sent to and whose rows are drawn, given the audiences listened to now
(jobs.live_publisher, jobs.live_audience)."""

from __future__ import annotations

import pytest

from jobs import live_publisher

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(("heard", "sent"), [
    (None, ["jobs.group.1", "jobs.group.2", "jobs.all", "jobs.job.1", "jobs.job.2", "jobs.utilisation"]),
    (set(), []),
    ({"jobs.utilisation"}, ["jobs.utilisation"]),
    ({"jobs.group.2", "jobs.group.9"}, ["jobs.group.2"]),
    ({"jobs.all"}, ["jobs.all"]),
    ({"jobs.job.2", "jobs.job.7"}, ["jobs.job.2"]),
])
def test_messages_go_only_to_the_audiences_heard(heard, sent):
    items = [{"id": 1, "group_id": 1, "at": 0.0, "row": "a"}, {"id": 2, "group_id": 2, "at": 0.0, "row": "b"}]
    assert [name for name, _ in live_publisher.change_messages(items, heard)] == sent


def test_a_jobs_page_gets_its_row_alone():
    items = [{"id": 1, "group_id": 1, "at": 0.0, "row": "a"}, {"id": 2, "group_id": 1, "at": 0.0, "row": "b"}]
    (name, message), = live_publisher.change_messages(items, {"jobs.job.2"})
    assert name == "jobs.job.2" and [item["id"] for item in message["items"]] == [2]


@pytest.mark.parametrize(("heard", "shown"), [
    (None, None),
    ({"jobs.all", "jobs.group.3"}, None),
    ({"jobs.group.3", "jobs.group.12", "jobs.utilisation", "jobs.job.5"}, {3, 12}),
    ({"jobs.utilisation"}, set()),
])
def test_the_groups_whose_rows_are_drawn(heard, shown):
    assert live_publisher._shown_groups(heard) == shown


@pytest.mark.parametrize(("heard", "shown"), [
    (None, set()),
    ({"jobs.group.3", "jobs.utilisation"}, set()),
    ({"jobs.job.5", "jobs.job.x", "jobs.group.3", "jobs.job.12"}, {5, 12}),
])
def test_the_jobs_whose_own_page_is_open(heard, shown):
    assert live_publisher._shown_jobs(heard) == shown
