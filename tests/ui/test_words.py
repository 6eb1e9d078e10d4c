"""Words that name what happens: each action's message names that action (cancel is not "stopped"), the bulk
confirmation names the action and the number of jobs, the queue page names its group once, and the API docs lead
back to the dashboard."""

from __future__ import annotations

import os
import re

import pytest
from django.urls import reverse

from jobs.choices import Phase
from jobs.models import Group, Job
from tests.browser import ARTIFACTS
from tests.ui import test_layout as layout

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM calls between Playwright's page actions

# The browser, the ASGI server and the logged-in pages of the layout tests.
live_asgi_server, shared_browser, open_page = layout.live_asgi_server, layout.shared_browser, layout.open_page

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1360, "height": 900}


def flash(response) -> str:
    """The text of the page's messages (after following the action's redirect)."""
    found = re.findall(r'<li class="message [^"]*"[^>]*>([^<]*)</li>', response.content.decode())
    assert found, "no message"
    return " ".join(found)


def act(client, job: Job, action: str):
    return client.post(reverse(f"jobs:{action}", kwargs={"pk": job.pk}), follow=True)


# --- each action's message names its own action ----------------------------------------------------------------------


@pytest.mark.django_db
def test_cancel_says_cancelled_and_stop_says_stopped(login, submit, make_pending):
    client = login("bob")
    cancelled, stopped = make_pending(submit("bob")), make_pending(submit("bob"))
    text = flash(act(client, cancelled, "cancel"))
    assert text == f"Job #{cancelled.pk} cancelled."
    text = flash(act(client, stopped, "stop"))
    assert text == f"Job #{stopped.pk} stopped; you can restart it."
    text = flash(act(client, stopped, "restart"))
    assert text.startswith(f"Job #{stopped.pk} restarted") and "phusers" in text


@pytest.mark.django_db
def test_a_running_job_is_being_cancelled_or_being_stopped_as_asked(login, submit, make_admitted):
    client = login("bob")
    (cancelled, _), (stopped, _) = make_admitted(submit("bob")), make_admitted(submit("bob"))
    text = flash(act(client, cancelled, "cancel"))
    assert text == f"Job #{cancelled.pk} is being cancelled."
    assert "stop" not in text.lower()
    text = flash(act(client, stopped, "stop"))
    assert text.startswith(f"Job #{stopped.pk} is being stopped")
    assert "cancel" not in text.lower()
    assert Job.objects.get(pk=cancelled.pk).phase == Job.objects.get(pk=stopped.pk).phase == Phase.TERMINATING


# --- the bulk confirmation names the action and the count --------------------------------------------------------


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_bulk_confirmation_names_the_action_and_the_number_of_jobs(open_page, world, submit):
    jobs = [submit("bob", name=f"bulk-{i}") for i in range(4)]
    page = open_page("bob", DESKTOP)
    page.wait_for_function("() => window.jobsite && window.jobsite.ready")
    asked = []

    def answer(dialog, accept: bool):
        asked.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    for job in jobs[:3]:
        page.check(f"#select-{job.pk}")
    page.once("dialog", lambda d: answer(d, True))
    page.click("button:has-text('Cancel selected')")
    page.locator("#bulk-result", has_text="Cancelled 3 jobs.").wait_for()
    assert asked == ["Cancel 3 selected jobs?"]
    assert [Job.objects.get(pk=j.pk).phase for j in jobs] == [Phase.CANCELLED] * 3 + [Phase.SUBMITTED]

    # Stop, one job, answered "no": nothing is sent.
    page.check(f"#select-{jobs[3].pk}")
    page.once("dialog", lambda d: answer(d, False))
    page.click("button:has-text('Stop selected')")
    assert asked[1] == "Stop 1 selected job? You can restart it later."
    # Answered "yes" this time: the one job is stopped (had the first try gone through, it would say "Skipped 1").
    page.once("dialog", lambda d: answer(d, True))
    page.click("button:has-text('Stop selected')")
    page.locator("#bulk-result", has_text="Stopped 1 job.").wait_for()
    assert asked[2] == asked[1] and "Skipped" not in page.locator("#bulk-result").inner_text()
    assert Job.objects.get(pk=jobs[3].pk).status == "Stopped"

    # Nothing checked: no question, the server says what to do.
    page.click("button:has-text('Cancel selected')")
    page.locator("#bulk-result", has_text="Select the jobs to act on first.").wait_for()
    assert len(asked) == 3
    assert page.errors == []


@pytest.mark.django_db
def test_bulk_buttons_carry_their_own_question_and_the_form_works_without_javascript(login, submit):
    job = submit("bob")
    client = login("bob")
    html = client.get(reverse("jobs:list")).content.decode()
    assert "Act on the selected jobs?" not in html and "hx-confirm" not in html
    assert 'data-confirm-many="Cancel {n} selected jobs?"' in html
    assert 'data-confirm-many="Stop {n} selected jobs? You can restart them later."' in html
    # Without JavaScript the buttons post the form as before.
    response = client.post(reverse("jobs:bulk"), {"ids": [job.pk], "action": "cancel"}, follow=True)
    assert "Cancelled 1 job." in flash(response)


# --- the queue page names its group once -------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("display_name", ["", "phusers", "PHUSERS"])
def test_the_queue_page_head_names_its_group_once(login, world, display_name):
    Group.objects.filter(name="phusers").update(display_name=display_name)
    html = login("bob").get(reverse("jobs:queue", kwargs={"name": "phusers"})).content.decode()
    title = re.search(r'<div class="title">(.*?)</div>', html, re.S).group(1)
    assert len(re.findall("phusers", title, re.I)) == 1, title
    assert len(re.findall("phusers", re.search(r"<title>(.*?)</title>", html).group(1), re.I)) == 1


@pytest.mark.django_db
def test_the_queue_page_shows_a_display_name_that_says_more(login, world):
    Group.objects.filter(name="phusers").update(display_name="Physics users")
    html = login("bob").get(reverse("jobs:queue", kwargs={"name": "phusers"})).content.decode()
    assert '<span class="muted">Physics users</span>' in html


# --- the API docs lead back --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_api_docs_link_back_to_the_dashboard(login):
    html = login("bob").get(reverse("api-docs")).content.decode()
    assert re.search(r'<a href="/" data-back>← Back to the dashboard</a>', html)
    assert '<div id="swagger-ui"></div>' in html  # Swagger UI is still there
    assert "<script>" not in html  # its init script comes from a URL: no inline script


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("size", "viewport"), [("phone", PHONE), ("desktop", DESKTOP)])
def test_the_api_docs_back_link_works_in_a_browser(open_page, world, size, viewport):
    page = open_page("bob", viewport)
    page.goto(page.base + reverse("api-docs"))
    page.locator(".swagger-ui .info .title").wait_for()  # Swagger UI drew the docs under the bar
    back = page.locator("a[data-back]")
    box = back.bounding_box()
    assert back.is_visible() and box["height"] >= 44 and box["y"] < 100
    page.screenshot(path=str(ARTIFACTS / f"api-docs-{size}.png"))
    back.click()
    page.wait_for_url(page.base + "/")
    assert page.errors == []

