"""The job page follows its job from the moment it opens (issue 22.1, 22.2), in a real browser (Chromium).

The race the pages lost: the page is drawn, then the scheduler admits the job (an attempt, its log, a reason to
wait) before the page's socket opens. The test makes that window wide and certain: the detail page's socket is held
at the server until the job has moved on, then let through.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading

import pytest

from jobs import consumers, services
from jobs.models import Job
from tests.live.test_live_browser import asgi_server, browser, logged_in, not_reloaded, scheduler  # noqa: F401
from tests.waiting import wait_for

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # ORM calls between Playwright's page actions

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TIMEOUT_MS = 60_000  # a busy machine: wait on conditions, generously
DETAIL_SOCKET = re.compile(r"^/ws/jobs/\d+/$")


@pytest.fixture
def held_detail_socket(monkeypatch):
    """While the event is clear, a detail page's socket waits at the server before it is accepted."""
    gate = threading.Event()
    gate.set()
    original = consumers._CoalescingConsumer.connect

    async def connect(self):
        if DETAIL_SOCKET.match(self.scope.get("path", "")):
            await asyncio.to_thread(gate.wait, 60)
        await original(self)

    monkeypatch.setattr(consumers._CoalescingConsumer, "connect", connect)
    return gate


def open_page(page, url: str) -> None:
    page.goto(url)
    page.evaluate("() => { window.__marker = 'still the same page'; }")


def test_the_page_drawn_before_admission_follows_the_job_and_its_restart(
        browser, asgi_server, scheduler, world, submit, held_detail_socket):  # noqa: F811
    blocker = submit("bob", "gpu-4", name="blocker", command="sleep 120")
    job = submit("bob", "gpu-1", name="follow-me", backoff_limit=0,
                 command="echo attempt $JOB_ATTEMPT first; sleep 1; echo attempt $JOB_ATTEMPT second; sleep 1; "
                         "echo attempt $JOB_ATTEMPT the last line; exit 3")
    page = logged_in(browser, asgi_server, "bob")
    page.set_default_timeout(TIMEOUT_MS)

    # Drawn while submitted; the scheduler then makes it wait (bob's quota is the blocker's) before the socket opens.
    held_detail_socket.clear()
    open_page(page, f"{asgi_server}/jobs/{job.pk}/")
    assert page.locator("#job-head .badge").inner_text() == "Submitted"
    assert page.locator("#logs-list [data-no-logs]").count() == 1
    scheduler.paused.clear()
    waiting = wait_for(lambda: Job.objects.filter(pk=job.pk, phase="PENDING").exclude(reason="").first(), timeout=60,
                       interval=0.1, message="the job pending with a reason")
    held_detail_socket.set()
    page.wait_for_selector("#job-head .badge.badge-orange:text-is('Pending')")
    page.wait_for_selector(f"#status-card dd:text-is('{waiting.reason}')")
    assert page.locator("#status-card").inner_text().count("Queue position") == 1

    # Admitted: its log appears and follows to the last line, and the job fails.
    services.job_cancel(job=Job.objects.get(pk=blocker.pk), by=world.users["bob"])
    page.wait_for_selector("#log-1-0 pre.log-text:has-text('attempt 1 first')")
    page.wait_for_selector("#log-1-0 pre.log-text:has-text('attempt 1 the last line')")
    page.wait_for_selector("#job-head .badge.badge-red")
    assert page.locator("#logs-list [data-no-logs]").count() == 0
    assert not_reloaded(page)

    # Restart: the page after it is drawn with attempt 1 only; attempt 2 starts before its socket opens.
    scheduler.paused.set()
    held_detail_socket.clear()
    page.locator("#job-head button:has-text('Restart')").click()
    page.wait_for_selector("#log-1-0")
    page.evaluate("() => { window.__marker = 'still the same page'; }")
    assert page.locator("#log-2-0").count() == 0
    scheduler.paused.clear()
    wait_for(lambda: Job.objects.filter(pk=job.pk, current_attempt__number=2, phase__in=["RUNNING", "FAILED"]).exists(),
             timeout=60, interval=0.1, message="attempt 2 running or failed")
    held_detail_socket.set()
    page.wait_for_selector("#log-2-0 pre.log-text:has-text('attempt 2 first')")
    page.wait_for_selector("#log-2-0 pre.log-text:has-text('attempt 2 the last line')")
    page.wait_for_selector("#attempts-card tbody tr:nth-child(2)")
    assert page.locator("#log-1-0").count() == 1 and not_reloaded(page)
