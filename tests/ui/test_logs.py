"""The log viewer in a real browser (Chromium) against the ASGI app: a log written faster than it can be shown
still shows its newest line, with a note of the bytes skipped; search jumps to a match; log text is only text."""

from __future__ import annotations

import os
import threading

import pytest
from django.db import connections

from jobs import services
from jobs.choices import Phase
from jobs.models import Job
from scheduler.backend_factory import get_backend
from tests.browser import ARTIFACTS
from tests.live.test_live_browser import asgi_server, browser  # noqa: F401 (fixtures)

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # ORM calls between Playwright's page actions

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TIMEOUT_MS = 60_000  # a busy machine: wait on conditions, generously

VIEWER_LINES = """() => [...document.querySelectorAll('#log-1-0 pre.log-text .log-piece')]
                        .reduce((n, p) => n + Number(p.dataset.lines), 0)"""


def open_detail(browser, base: str, username: str, job_id: int):  # noqa: F811
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(base + "/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", f"pw-{username}")
    page.click("button:has-text('Log in')")
    page.wait_for_url(base + "/")
    page.goto(f"{base}/jobs/{job_id}/")
    # Following: the viewer's socket is open and it asked for what comes next.
    page.wait_for_function("() => window.jobsite.logview && window.jobsite.logview.viewers().length && "
                           "window.jobsite.logview.viewers()[0].subscribed")
    return page


def test_a_fast_log_shows_its_newest_line_and_can_be_searched(browser, asgi_server, world, submit):  # noqa: F811
    from tests.live.conftest import admitted

    job, attempt = admitted(submit("bob", "gpu-1", name="fast-log"))
    services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.RUNNING, reason="Started", message="")
    path = get_backend().log_path(job_id=job.pk, attempt_number=1, rank=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('\x1b[1;31mERROR\x1b[0m <script>window.__xss=1</script> <img src=x onerror="window.__xss=2">\n')

    page = open_detail(browser, asgi_server, "bob", job.pk)
    viewer = page.locator("#log-1-0")
    text = viewer.locator("pre.log-text")
    assert viewer.locator("span.ansi-fg-1.ansi-bold").inner_text() == "ERROR"
    assert "<script>window.__xss=1</script> <img src=x" in text.inner_text()
    assert text.locator("img, script").count() == 0 and page.evaluate("() => window.__xss") is None
    assert viewer.locator("[data-log-follow]").is_checked()

    # ~40 MB in a burst, as a job printing as fast as it can: far more than the page could render line by line.
    def write():
        with path.open("a") as f:
            for block in range(400):
                f.write("".join(f"line {block * 1000 + i:07d} {'.' * 86}\n" for i in range(1000)))
                if block == 100:
                    f.write("needle: the one line to find\n")
            f.write("the newest line\n")

    writer = threading.Thread(target=write)
    writer.start()
    writer.join()
    page.wait_for_function("() => document.querySelector('#log-1-0 pre.log-text').textContent"
                           ".endsWith('the newest line')")
    skipped = viewer.locator("[data-log-above][data-log-skipped]")
    assert skipped.is_visible() and "Skipped" in skipped.inner_text()
    assert page.evaluate(VIEWER_LINES) <= 5000 + 200  # the page keeps a bounded number of lines
    assert page.evaluate("""() => { const p = document.querySelector('#log-1-0 pre.log-text');
                                    return p.scrollTop + p.clientHeight >= p.scrollHeight - 8; }""")
    viewer.screenshot(path=str(ARTIFACTS / "log-viewer-skipped.png"))

    # Search the whole log: the match is shown with the lines around it, following stops.
    viewer.locator("[data-log-query]").fill("NEEDLE: the one")
    viewer.locator("[data-log-query]").press("Enter")
    match = viewer.locator(".log-match")
    # The window around the match is rendered over a few frames; the state line says when it is all shown.
    page.wait_for_function("() => /Match at byte/.test(document.querySelector('#log-1-0 .log-state').textContent)")
    assert match.inner_text().strip() == "needle: the one line to find"
    assert match.is_visible() and not viewer.locator("[data-log-follow]").is_checked()
    # The lines around it (waited for: once in CI the viewer's text was read empty just after the state line).
    page.wait_for_function("""() => { const t = document.querySelector('#log-1-0 pre.log-text').textContent;
                                      return t.includes('line 0100999') && t.includes('line 0101000'); }""")
    viewer.locator("[data-log-prev]").click()
    page.wait_for_function("() => /No match above/.test(document.querySelector('#log-1-0 .log-state').textContent)")
    viewer.screenshot(path=str(ARTIFACTS / "log-viewer-search.png"))

    # Jump to the start, and back to the end, which follows again.
    viewer.locator("[data-log-start]").click()
    page.wait_for_function("() => document.querySelector('#log-1-0 pre.log-text').textContent"
                           ".startsWith('ERROR <script>')")
    assert viewer.locator("[data-log-above]").is_hidden()
    viewer.locator("[data-log-end]").click()
    page.wait_for_function("() => document.querySelector('#log-1-0 pre.log-text').textContent"
                           ".endsWith('the newest line')")
    assert viewer.locator("[data-log-follow]").is_checked()

    # Raw in a new tab, and a download, from the API.
    raw = viewer.locator("[data-log-raw]")
    assert raw.get_attribute("target") == "_blank"
    assert raw.get_attribute("href") == f"/api/v1/jobs/{job.pk}/logs/raw/?attempt=1&replica=0"
    with page.expect_download() as download:
        viewer.locator("[data-log-download]").click()
    assert download.value.suggested_filename == f"job-{job.pk}-attempt-1-replica-0.log"

    # The job ends: "Follow" un-ticks itself.
    services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.SUCCEEDED, reason="Completed", message="")
    page.wait_for_function("() => !document.querySelector('#log-1-0 [data-log-follow]').checked")
    connections.close_all()
