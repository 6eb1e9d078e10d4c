"""Selecting jobs on the list and cancelling or stopping them together: without JavaScript (a form) and with htmx."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from jobs.choices import Phase
from jobs.models import Job

BULK = reverse("jobs:bulk")


def phases(*jobs: Job) -> list[str]:
    return [Job.objects.get(pk=j.pk).phase for j in jobs]


@pytest.mark.django_db
def test_rows_have_a_checkbox_of_the_bulk_form(login, submit):
    job = submit("bob", name="pick-me")
    html = login("bob").get(reverse("jobs:list")).content.decode()
    assert f'<input type="checkbox" id="select-{job.pk}" name="ids" value="{job.pk}" form="bulk-form"' in html
    assert re.search(r'<form method="post" action="/jobs/selected/" id="bulk-form"', html)
    assert 'value="cancel"' in html and 'value="stop"' in html and "data-select-all" in html


@pytest.mark.django_db
def test_cancel_selected_without_javascript_says_what_was_done_and_skipped(login, submit):
    mine = [submit("bob", name=f"mine-{i}") for i in range(2)]
    theirs = submit("pan", name="not-mine")
    client = login("bob")
    response = client.post(BULK, {"ids": [mine[0].pk, mine[1].pk, theirs.pk], "action": "cancel",
                                  "next": "/?user=bob"}, follow=True)
    assert response.redirect_chain == [("/?user=bob", 302)]
    text = response.content.decode()
    assert "Cancelled 2 jobs. Skipped 1." in text
    assert f"#{theirs.pk}: You can act only on your own jobs" in text
    assert phases(*mine) == [Phase.CANCELLED, Phase.CANCELLED]
    assert phases(theirs) == [Phase.SUBMITTED]


@pytest.mark.django_db
def test_stop_selected_and_an_ended_job_is_skipped_with_its_reason(login, submit):
    running = submit("bob", name="to-stop")
    ended = submit("bob", name="ended")
    client = login("bob")
    client.post(BULK, {"ids": [ended.pk], "action": "cancel"})
    response = client.post(BULK, {"ids": [running.pk, ended.pk], "action": "stop"}, follow=True)
    text = response.content.decode()
    assert "Stopped 1 job. Skipped 1." in text and f"#{ended.pk}: " in text
    job = Job.objects.get(pk=running.pk)
    assert (job.phase, job.status) == (Phase.CANCELLED, "Stopped")


@pytest.mark.django_db
@pytest.mark.parametrize(("data", "message"), [
    ({"action": "cancel"}, "Select the jobs to act on first."),
    ({"ids": ["1"], "action": "delete"}, "Choose Cancel selected or Stop selected."),
])
def test_bad_bulk_input_changes_nothing(login, submit, data, message):
    job = submit("bob")
    data = {**data, "ids": [str(job.pk)] if "ids" in data else []}
    response = login("bob").post(BULK, data, follow=True)
    assert message in response.content.decode()
    assert phases(job) == [Phase.SUBMITTED]


@pytest.mark.django_db
def test_bulk_with_htmx_answers_the_result_block(login, submit):
    mine = submit("bob")
    theirs = submit("lin")
    response = login("bob").post(BULK, {"ids": [mine.pk, theirs.pk], "action": "cancel"}, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200 and html.startswith('<div id="bulk-result"')
    assert "Cancelled 1 job. Skipped 1." in html and f'href="/jobs/{theirs.pk}/">#{theirs.pk}</a>' in html
    assert "<html" not in html


@pytest.mark.django_db
def test_bulk_needs_post_and_login(client, submit, world):
    job = submit("bob")
    assert client.post(BULK, {"ids": [job.pk], "action": "cancel"}).status_code == 302  # to the login page
    client.force_login(world.users["bob"])
    assert client.get(BULK).status_code == 405
    assert phases(job) == [Phase.SUBMITTED]

# In a real browser (htmx, the live list): tests/live/test_live_browser.py::test_select_two_and_cancel_them.
