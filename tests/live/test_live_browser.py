"""The live dashboard in a real browser: Debian's Chromium (Playwright) against the ASGI app under uvicorn.

pytest-django's live_server is WSGI-only and cannot serve WebSockets, so the ``asgi_server`` fixture (conftest) runs
uvicorn with ``jobsite.asgi:application`` in a thread, on the test database, with the in-memory channel layer
(the embedded default). The test drives the scheduler itself (``scheduler.passes.schedule_pass`` and
``scheduler.sync.sync_jobs`` in a thread it can pause), so every colour can be seen.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from django.db import connections

from jobs import services
from jobs.choices import Role
from jobs.models import Job, Membership
from scheduler.backend_factory import get_backend
from tests.browser import ARTIFACTS, chromium
from tests.live import conftest as live_conftest

# Playwright's sync API runs an event loop in this thread; the ORM calls made here between page actions are
# plain synchronous code all the same.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"


pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


# Records every colour each row's badge shows, in order (consecutive repeats once), without touching the page.
WATCH_ROWS = """() => {
  window.__colors = {};
  const record = () => {
    for (const row of document.querySelectorAll('#job-rows tr[data-job]')) {
      const badge = row.querySelector('.badge');
      const color = (badge.className.match(/badge-(\\w+)/) || [])[1];
      const seen = (window.__colors[row.dataset.job] = window.__colors[row.dataset.job] || []);
      if (seen[seen.length - 1] !== color) seen.push(color);
    }
  };
  new MutationObserver(record).observe(document.getElementById('job-rows'),
                                       {subtree: true, childList: true, attributes: true, characterData: true});
  record();
}"""


class Scheduler(threading.Thread):
    """The scheduler loop of the embedded server, run by the test: a pass and a sync every 0.2 s unless paused."""

    def __init__(self):
        super().__init__(name="test-scheduler", daemon=True)
        self.paused = threading.Event()
        self.stopping = threading.Event()

    def run(self):
        from scheduler.passes import schedule_pass
        from scheduler.sync import sync_jobs

        try:
            while not self.stopping.is_set():
                if not self.paused.is_set():
                    try:
                        schedule_pass()
                        sync_jobs()
                    except Exception:  # a round racing the test's teardown
                        if not self.stopping.is_set():
                            raise
                time.sleep(0.2)
        finally:
            connections.close_all()


# In tests/live/conftest.py; the other suites' browser tests import it from here.
asgi_server = live_conftest.asgi_server


@pytest.fixture
def scheduler(asgi_server):
    loop = Scheduler()
    loop.paused.set()
    loop.start()
    yield loop
    loop.stopping.set()
    loop.join(10)
    for job in Job.objects.exclude(phase__in=["SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT", "PREEMPTED"]):
        attempt = job.current_attempt
        if attempt:  # no process outlives the test
            get_backend().stop(job_id=job.pk, attempt_number=attempt.number, replicas=attempt.replicas, force=True)


@pytest.fixture
def browser(asgi_server):
    try:
        with chromium() as launched:
            yield launched
    finally:
        connections.close_all()


def logged_in(browser, base: str, username: str, path: str = "/"):
    """A page of a fresh browser context (its own cookies) with ``username`` logged in, at ``path``."""
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(base + "/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", f"pw-{username}")
    page.click("button:has-text('Log in')")
    page.wait_for_url(base + "/")
    if path != "/":
        page.goto(base + path)
    live_and_marked(page)
    return page


def live_and_marked(page) -> None:
    """Wait for the page's socket, then mark the window: a reload would lose the mark."""
    page.wait_for_function("() => window.jobsite && window.jobsite.ready && "
                           "(window.jobsite.opened >= 1 || !document.querySelector('[data-live]'))")
    page.evaluate("() => { window.__marker = 'still the same page'; }")


def not_reloaded(page) -> bool:
    return page.evaluate("() => window.__marker") == "still the same page"


def row_badge(page, job_id: int):
    return page.locator(f'#job-rows tr[data-job="{job_id}"] .badge')


def wait_badge(page, job_id: int, color: str, text: str | None = None) -> None:
    page.wait_for_selector(f'#job-rows tr[data-job="{job_id}"] .badge.badge-{color}')
    if text is not None:
        assert row_badge(page, job_id).inner_text() == text


def test_owner_and_group_admin_watch_a_job_run_without_reload(browser, asgi_server, scheduler, world, submit):
    Membership.objects.filter(group=world.groups["phusers"], user=world.users["pan"]).update(role=Role.ADMIN)
    history = submit("lin", "gpu-1", name="earlier-run")
    services.job_cancel(job=history, by=world.users["lin"])

    owner = logged_in(browser, asgi_server, "bob")
    admin = logged_in(browser, asgi_server, "pan")
    outsider = logged_in(browser, asgi_server, "eve")
    for page in (owner, admin):
        page.evaluate(WATCH_ROWS)

    form = logged_in(browser, asgi_server, "bob", "/jobs/new/")
    form.fill("input[name=name]", "live-run")
    form.select_option("select[name=instance_type]", "gpu-1")
    form.fill("textarea[name=command]", "sleep 2; echo done")
    form.click("button:has-text('Submit job')")
    form.wait_for_url("**/jobs/*/")
    job = Job.objects.get(name="live-run")
    detail = form
    live_and_marked(detail)
    assert detail.locator("#job-head .badge").inner_text() == "Submitted"

    # The new job appears at the top of both lists, orange, while the scheduler is paused.
    for page in (owner, admin):
        wait_badge(page, job.pk, "orange", "Submitted")
        assert page.locator("#job-rows tr").first.get_attribute("data-job") == str(job.pk)
    owner.screenshot(path=str(ARTIFACTS / "live-list-submitted.png"), full_page=True)

    scheduler.paused.clear()
    for page in (owner, admin):
        wait_badge(page, job.pk, "green")
    detail.wait_for_selector("#job-head .badge.badge-green")
    # The log viewer of the new attempt appears and follows the file: the line arrives by itself.
    detail.wait_for_selector("#log-1-0 pre.log-text:has-text('done')", timeout=20_000)
    for page in (owner, admin):
        wait_badge(page, job.pk, "blue", "Succeeded")
        assert page.evaluate(f"() => window.__colors['{job.pk}']") == ["orange", "green", "blue"]
        assert not_reloaded(page)
    detail.wait_for_selector("#job-head .badge.badge-blue")
    assert detail.locator("#log-1-0 pre.log-text").inner_text().strip() == "done"
    events = detail.locator("#events tbody").inner_text()
    assert "Admitted" in events and "Completed" in events
    detail.wait_for_selector("#attempts-card td:has-text('Completed')")
    assert not_reloaded(detail)
    owner.screenshot(path=str(ARTIFACTS / "live-list-succeeded.png"), full_page=True)
    detail.screenshot(path=str(ARTIFACTS / "live-detail-succeeded.png"), full_page=True)

    # The user outside the group saw none of it.
    assert outsider.evaluate("() => window.jobsite.received") == 0
    assert outsider.locator(f'#job-rows tr[data-job="{job.pk}"]').count() == 0
    assert not_reloaded(outsider)
    outsider.screenshot(path=str(ARTIFACTS / "live-list-outsider.png"), full_page=True)


def test_cancel_from_the_ui_turns_the_row_grey(browser, asgi_server, scheduler, world, submit):
    lister = logged_in(browser, asgi_server, "bob")
    lister.evaluate(WATCH_ROWS)
    outsider = logged_in(browser, asgi_server, "eve")
    job = submit("bob", "cpu-tiny", name="long-one", command="sleep 600")
    wait_badge(lister, job.pk, "orange")
    scheduler.paused.clear()
    lister.wait_for_selector(f'#job-rows tr[data-job="{job.pk}"] .badge:has-text("Running")')

    detail = logged_in(browser, asgi_server, "bob", f"/jobs/{job.pk}/")
    detail.on("dialog", lambda dialog: dialog.accept())
    detail.click("button:has-text('Cancel job')")
    detail.wait_for_url(f"**/jobs/{job.pk}/")
    live_and_marked(detail)
    wait_badge(lister, job.pk, "grey", "Cancelled")
    detail.wait_for_selector("#job-head .badge.badge-grey")
    # No longer offered, once the head has been refetched after the change (Playwright's expect retries).
    from playwright.sync_api import expect

    expect(detail.locator("#job-head .actions")).not_to_contain_text("Cancel job")
    assert lister.evaluate(f"() => window.__colors['{job.pk}']")[-2:] == ["green", "grey"]
    assert not_reloaded(lister) and not_reloaded(detail)
    assert "CancelledByUser" in lister.locator(f'#job-rows tr[data-job="{job.pk}"] td.reason').inner_text()
    lister.screenshot(path=str(ARTIFACTS / "live-list-cancelled.png"), full_page=True)
    detail.screenshot(path=str(ARTIFACTS / "live-detail-cancelled.png"), full_page=True)
    assert outsider.evaluate("() => window.jobsite.received") == 0


def test_a_replica_that_fails_while_watching_is_marked_and_unfolded(browser, asgi_server, world, submit):
    from jobs.models import Attempt
    from tests.live.conftest import admitted

    job, first = admitted(submit("bob", "gpu-1", name="ddp-retry", replicas=2))
    Attempt.objects.filter(pk=first.pk).update(failed_rank=0, exit_code=137)
    second = Attempt.objects.create(job=job, number=2, replicas=2, gpu=1, backend="local")
    Job.objects.filter(pk=job.pk).update(current_attempt=second)
    for number, rank in ((1, 0), (2, 0), (2, 1)):
        path = get_backend().log_path(job_id=job.pk, attempt_number=number, rank=rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"attempt {number} rank {rank}: step 1\n")
    page = logged_in(browser, asgi_server, "bob", f"/jobs/{job.pk}/")
    page.evaluate("() => { document.getElementById('log-2-0').open = false; }")  # folded by the reader

    # Replica 1 of the current attempt fails while the page is open.
    Attempt.objects.filter(pk=second.pk).update(failed_rank=1, exit_code=2)
    services.event_record(job=Job.objects.get(pk=job.pk), reason="ReplicaFailed", message="replica 1 exited 2")
    page.wait_for_selector("#log-2-1[data-failed] summary .failed-mark")
    assert page.locator("#log-2-1 summary .failed-mark").inner_text() == "failed · exit 2"
    assert page.locator("#log-2-1").evaluate("el => el.open") is True
    assert page.locator("#log-2-1 pre.log-text").inner_text().startswith("attempt 2 rank 1")  # its lines kept
    assert page.locator("#log-2-0").evaluate("el => el.open") is False  # folded by the reader: stays so
    assert page.locator("#log-2-0 .failed-mark").count() == 0
    page.wait_for_selector("#status-card dd.failed-rank")
    assert page.locator("#status-card dd.failed-rank").inner_text() == "replica 1 failed first in attempt 2"
    assert page.locator("table.attempts td.failed-rank").all_inner_texts() == ["replica 0 failed", "replica 1 failed"]
    assert not_reloaded(page)
    page.screenshot(path=str(ARTIFACTS / "ui-detail-failed-rank-live.png"), full_page=True)


def test_log_viewer_colours_safely_loads_earlier_and_queue_is_live(browser, asgi_server, world, submit):
    from tests.live.conftest import admitted

    job, attempt = admitted(submit("bob", "gpu-1", name="logs"))
    path = get_backend().log_path(job_id=job.pk, attempt_number=1, rank=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    filler = "".join(f"line {i:06d} " + "." * 60 + "\n" for i in range(6000))  # ~450 KiB: more than the tail
    path.write_text(filler + "\x1b[1;31mERROR\x1b[0m <img src=x onerror=\"window.__xss=1\"> \x1b[38;5;45mcyan\x1b[0m\n")

    page = logged_in(browser, asgi_server, "bob", f"/jobs/{job.pk}/")
    viewer = page.locator("#log-1-0")
    red = viewer.locator("pre.log-text span.ansi-fg-1.ansi-bold")
    assert red.inner_text() == "ERROR"
    assert viewer.locator("pre.log-text img").count() == 0 and page.evaluate("() => window.__xss") is None
    assert "<img src=x" in viewer.locator("pre.log-text").inner_text()
    cyan = viewer.locator("pre.log-text .log-piece span").get_by_text("cyan", exact=True)
    assert cyan.evaluate("e => e.style.color") == "rgb(0, 215, 255)"  # 256-colour 45
    assert "line 000000" not in viewer.locator("pre.log-text").inner_text()

    # Follow: appended lines arrive and the view stays at the end.
    with path.open("a") as f:
        f.write("\x1b[32mappended while watching\x1b[0m\n")
    page.wait_for_selector("#log-1-0 span.ansi-fg-2:has-text('appended while watching')")
    assert page.evaluate("""() => { const p = document.querySelector('#log-1-0 pre.log-text');
                                    return p.scrollTop + p.clientHeight >= p.scrollHeight - 8; }""")
    page.screenshot(path=str(ARTIFACTS / "live-log-viewer.png"), full_page=False, clip=None)
    viewer.scroll_into_view_if_needed()
    viewer.screenshot(path=str(ARTIFACTS / "live-log-viewer-detail.png"))

    # Load earlier until the start of the file.
    while viewer.locator("[data-log-earlier]").is_visible():
        before = page.evaluate("() => document.querySelector('#log-1-0 pre.log-text').textContent.length")
        viewer.locator("[data-log-earlier]").click()
        page.wait_for_function(
            f"() => document.querySelector('#log-1-0 pre.log-text').textContent.length > {before}")
    assert viewer.locator("pre.log-text").inner_text().startswith("line 000000 ")
    assert not_reloaded(page)
    # Scrolling up stops following; "Jump to end" starts it again.
    page.evaluate("() => { document.querySelector('#log-1-0 pre.log-text').scrollTop = 0; }")
    page.wait_for_function("() => !document.querySelector('#log-1-0 [data-log-follow]').checked")
    viewer.locator("[data-log-end]").click()
    assert viewer.locator("[data-log-follow]").is_checked()

    # The queue page of phusers refreshes its block when a job of the group changes.
    queue = logged_in(browser, asgi_server, "pan", "/groups/phusers/queue/")
    assert queue.locator(".queue-table").count() == 0
    waiting = submit("pan", "gpu-4", name="needs-four")
    queue.wait_for_selector(f'.queue-table tr[data-job="{waiting.pk}"]')
    assert not_reloaded(queue)
    queue.screenshot(path=str(ARTIFACTS / "live-queue.png"), full_page=True)

    util = logged_in(browser, asgi_server, "eve", "/utilisation/")
    assert util.locator(".tile-value").nth(1).inner_text() == "1"
    services.job_cancel(job=Job.objects.get(pk=job.pk), by=world.users["bob"])  # TERMINATING: still holds
    services.job_transition(job=Job.objects.get(pk=job.pk), phase="CANCELLED", status="Cancelled",
                            reason="CancelledByUser")  # as the sync loop does once the processes are gone
    util.wait_for_function("() => document.querySelectorAll('.tile-value')[1].textContent === '0'")
    assert not_reloaded(util)
    util.screenshot(path=str(ARTIFACTS / "live-utilisation.png"), full_page=True)

    # Two weeks of GPU time of three users, for a chart worth looking at.
    from datetime import timedelta

    from django.utils import timezone

    from jobs.models import Attempt

    now = timezone.now()
    for day in range(14):
        for k, who in enumerate(("bob", "pan", "lin")):
            past = submit(who, "gpu-2", name=f"past-{who}-{day}")
            hours = (day * 7 + k * 5) % 11 + 1
            Attempt.objects.create(job=past, number=1, replicas=1, gpu=2, backend="local",
                                   started_at=now - timedelta(days=day, hours=hours),
                                   ended_at=now - timedelta(days=day), gpu_seconds=2 * hours * 3600)
    usage = logged_in(browser, asgi_server, "bob", "/usage/?days=14")
    assert usage.locator("svg rect").count() >= 14  # one segment per user and day the attempts started
    usage.screenshot(path=str(ARTIFACTS / "live-usage.png"), full_page=True)
    form = logged_in(browser, asgi_server, "bob", "/jobs/new/")
    form.click("summary:has-text('YAML job spec')")
    form.fill("textarea[name=spec]", "name: x\ngpus: 2\nreplicas: lots\n")
    form.click("button:has-text('Fill in the form')")
    form.wait_for_selector("#yaml-errors")
    assert "gpus: Unknown field." in form.inner_text("#yaml-errors")
    form.screenshot(path=str(ARTIFACTS / "live-submit-yaml-errors.png"), full_page=True)


def test_select_two_and_cancel_them(asgi_server, browser, world, submit):
    mine = [submit("bob", name=f"bulk-{i}") for i in range(2)]
    theirs = submit("pan", name="pans-job")
    page = logged_in(browser, asgi_server, "bob")
    page.on("dialog", lambda dialog: dialog.accept())
    for job in (*mine, theirs):
        page.check(f"#select-{job.pk}")
    page.click("button:has-text('Cancel selected')")
    page.wait_for_selector("#bulk-result:has-text('Cancelled 2 jobs. Skipped 1.')")
    assert "You can act only on your own jobs" in page.inner_text("#bulk-result")
    for job in mine:  # the rows turn grey by themselves (the live list)
        page.wait_for_selector(f'#job-rows tr[data-job="{job.pk}"] .badge.badge-grey:has-text("Cancelled")')
    assert page.locator(f'#job-rows tr[data-job="{theirs.pk}"] .badge').inner_text() == "Submitted"
    assert not page.is_checked(f"#select-{mine[0].pk}")
    assert not_reloaded(page)
    page.screenshot(path=str(ARTIFACTS / "ui-bulk-cancelled.png"), full_page=True)

    # Select all on the page, then Stop: the ended ones are skipped with their reason.
    page.check("[data-select-all]")
    assert page.is_checked(f"#select-{theirs.pk}")
    page.click("button:has-text('Stop selected')")
    page.wait_for_selector("#bulk-result:has-text('Stopped 0 jobs. Skipped 3.')")


def test_a_live_row_is_the_row_of_a_fresh_page_and_filters_hold(asgi_server, browser, world, submit):
    from tests.live.conftest import admitted

    job, _ = admitted(submit("bob", "gpu-1", name="to-finish"))
    services.job_transition(job=Job.objects.get(pk=job.pk), phase="RUNNING")
    everything = logged_in(browser, asgi_server, "bob")
    running = logged_in(browser, asgi_server, "bob", "/?phase=RUNNING")
    wait_badge(running, job.pk, "green", "Running")

    services.job_transition(job=Job.objects.get(pk=job.pk), phase="SUCCEEDED", reason="Completed", exit_code=0)
    wait_badge(everything, job.pk, "blue", "Succeeded")
    running.wait_for_selector(f'#job-rows tr[data-job="{job.pk}"]', state="detached")  # no longer RUNNING
    assert not_reloaded(everything) and not_reloaded(running)

    # The row swapped in live is the row a fresh page draws (one template).
    def row_html(page):
        html = page.locator(f'#job-rows tr[data-job="{job.pk}"]').evaluate("e => e.outerHTML")
        return html.replace(' class=""', "")

    fresh = logged_in(browser, asgi_server, "bob")
    assert row_html(everything) == row_html(fresh)


def test_queue_and_utilisation_pages_refetch_their_block(browser, asgi_server, world, submit):
    queue = logged_in(browser, asgi_server, "pan", "/groups/phusers/queue/")
    util = logged_in(browser, asgi_server, "lin", "/utilisation/")
    assert queue.locator(".queue-table").count() == 0
    queued = util.locator(".tile-value").nth(4).inner_text()
    waiting = submit("pan", "gpu-4", name="needs-four")
    queue.wait_for_selector(f'.queue-table tr[data-job="{waiting.pk}"]')
    util.wait_for_function(f"() => document.querySelectorAll('.tile-value')[4].textContent !== '{queued}'")
    assert not_reloaded(queue) and not_reloaded(util)
