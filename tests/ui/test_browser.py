"""The UI in a real browser: Debian's Chromium driven by Playwright against pytest-django's live server."""

from __future__ import annotations

import os
import time

import pytest
from django.db import connections

from jobs.models import InstanceType, Job
from tests.browser import ARTIFACTS, chromium

# Playwright's sync API runs an event loop in this thread; the ORM calls made here between page actions are
# plain synchronous code all the same.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


ORANGE = "rgb(253, 134, 8)"
GREEN = "rgb(89, 155, 62)"


@pytest.fixture
def page(live_server):
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1360, "height": 900})
        pg = context.new_page()
        pg.set_default_timeout(10_000)
        try:
            yield pg
        finally:
            context.close()
            # ORM calls made while Playwright's loop ran may have opened their own connection: close it, or
            # the test database cannot be dropped at the end of the session.
            connections.close_all()


def log_in(page, live_server, username: str) -> None:
    page.goto(live_server.url + "/")
    assert "/login/" in page.url  # anonymous: sent to the login form
    page.screenshot(path=str(ARTIFACTS / "ui-login.png"))
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", f"pw-{username}")
    page.click("button:has-text('Log in')")
    page.wait_for_url(live_server.url + "/")


def badge(page):
    return page.locator(".page-head .badge").first


def background(locator) -> str:
    return locator.evaluate("el => getComputedStyle(el).backgroundColor")


def test_submit_and_watch_it_get_admitted(page, live_server, world, submit):
    from scheduler.passes import schedule_pass

    # Some history so the list shows several colours.
    done = submit("pan", "gpu-1", name="finished-run")
    from jobs import services

    services.job_cancel(job=done, by=world.users["pan"])
    submit("lin", "gpu-4", name="big-sweep")

    log_in(page, live_server, "bob")
    page.click("a:has-text('Submit a job')")
    page.wait_for_url("**/jobs/new/")
    page.fill("input[name=name]", "hello-browser")
    page.select_option("select[name=instance_type]", "cpu-tiny")
    page.fill("textarea[name=command]", "echo hello")
    page.fill("textarea[name=env]", "GREETING=hi")
    page.screenshot(path=str(ARTIFACTS / "ui-submit-form.png"), full_page=True)
    page.click("button:has-text('Submit job')")

    page.wait_for_url("**/jobs/*/")
    job = Job.objects.get(name="hello-browser")
    assert page.url.endswith(f"/jobs/{job.pk}/")
    assert badge(page).inner_text() == "Submitted"
    assert background(badge(page)) == ORANGE
    page.screenshot(path=str(ARTIFACTS / "ui-detail-submitted.png"), full_page=True)

    # Behind bob's job in the queue: the group's 4 GPUs go to big-sweep, so this one waits.
    submit("pan", "gpu-2", name="waits-for-quota")
    result = schedule_pass()
    assert job.pk in result.admitted

    page.reload()
    assert badge(page).inner_text() == "ContainerCreating"
    assert background(badge(page)) == GREEN
    # The local backend ran `echo hello`: its log shows up in the replica's log block.
    deadline = time.monotonic() + 15
    while not any("hello" in t for t in page.locator("pre.log-text").all_inner_texts()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
        page.reload()
    assert page.locator("pre.log-text").first.inner_text().strip() == "hello"
    page.screenshot(path=str(ARTIFACTS / "ui-detail-admitted.png"), full_page=True)

    page.click("nav.mainnav a:has-text('Jobs')")
    page.wait_for_url(live_server.url + "/")
    row = page.locator("table.jobs tbody tr", has_text="hello-browser")
    assert background(row.locator(".badge")) == GREEN
    waiting = page.locator("table.jobs tbody tr", has_text="waits-for-quota")
    assert waiting.locator(".badge").inner_text() == "Pending"
    assert background(waiting.locator(".badge")) == ORANGE
    assert "#1 in phusers" in waiting.inner_text()
    page.screenshot(path=str(ARTIFACTS / "ui-list.png"), full_page=True)


def test_group_switch_reloads_choices_with_htmx(page, live_server, world):
    it = InstanceType.objects.create(name="research-only", gpu=8, cpu_millicores=64000, memory_bytes=256 << 30)
    it.groups.add(world.groups["research"])

    log_in(page, live_server, "lin")
    page.goto(live_server.url + "/jobs/new/")
    page.fill("textarea[name=command]", "python keep-me.py")
    assert page.locator("select[name=instance_type] option[value='research-only']").count() == 0

    page.select_option("select[name=group]", "research")
    page.wait_for_selector("select[name=instance_type] option[value='research-only']", state="attached")
    assert page.locator("caption", has_text="Quota of research").count() == 1
    assert page.input_value("textarea[name=command]") == "python keep-me.py"  # typed text stays
    page.screenshot(path=str(ARTIFACTS / "ui-submit-research.png"), full_page=True)

    # Errors come back next to their fields, and nothing is submitted.
    page.select_option("select[name=instance_type]", "gpu-4")
    page.fill("input[name=replicas]", "2")
    page.fill("textarea[name=env]", "OK=1\n1BAD=x")
    page.click("button:has-text('Submit job')")
    page.wait_for_selector("#field-env .field-errors")
    assert "Line 2" in page.inner_text("#field-env .field-errors")
    assert "user GPU quota" in page.inner_text("#field-replicas .field-errors")
    assert page.input_value("select[name=group]") == "research"
    assert Job.objects.count() == 0
    page.screenshot(path=str(ARTIFACTS / "ui-submit-errors.png"), full_page=True)

    page.select_option("select[name=group]", "phusers")
    page.wait_for_selector("caption:has-text('Quota of phusers')")
    assert page.locator("select[name=instance_type] option[value='research-only']").count() == 0
