"""A log written at 10 MB/s in a real browser (Chromium): every look at the viewer while the job runs shows log
lines (never only the note of the bytes skipped), the newest at most 2 s old (issue 22.3), whether the page was
opened while the job runs or before it started."""

from __future__ import annotations

import os
import threading
import time

import pytest
from django.db import connections

from jobs import services
from jobs.choices import Phase
from jobs.models import Job
from scheduler.backend_factory import get_backend
from tests.live.test_live_browser import asgi_server, browser  # noqa: F401 (fixtures)
from tests.ui.test_logs import open_detail

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # ORM calls between Playwright's page actions

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RATE = 10 * 1024 * 1024  # bytes a second
TICK = 0.05
SAMPLES, EVERY = 12, 0.5
MAX_AGE = 2.0

SAMPLE = """() => {
  const pre = document.querySelector('#log-1-0 pre.log-text');
  const lines = pre ? [...pre.querySelectorAll('.log-piece')].reduce((n, p) => n + Number(p.dataset.lines), 0) : 0;
  const text = pre ? pre.textContent : '';
  const marker = document.querySelector('#log-1-0 [data-log-above][data-log-skipped]');
  return {lines, last: text.slice(text.lastIndexOf('\\n') + 1), marker: !!marker && !marker.hidden};
}"""


class Writer(threading.Thread):
    """Appends RATE bytes a second of lines that say when they were written, until stopped."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path, self.stopping, self.written = path, threading.Event(), 0

    def run(self):
        lines = int(RATE * TICK / 100)
        with self.path.open("a") as f:
            while not self.stopping.is_set():
                began = time.time()
                line = f"{began:.3f} {'x' * (100 - 16)}\n"  # 100 bytes
                f.write(line * lines)
                f.flush()
                self.written += len(line) * lines
                time.sleep(max(0.0, TICK - (time.time() - began)))


def samples(page) -> list[dict]:
    """Looks at the viewer every EVERY seconds, once the writer's lines showed (a generous wait: a busy machine)."""
    page.wait_for_function("() => /\\n\\d+\\.\\d+ x+$/.test(document.querySelector('#log-1-0 pre.log-text')"
                           "?.textContent || '')", timeout=60_000)
    taken = []
    for _ in range(SAMPLES):
        time.sleep(EVERY)
        seen = page.evaluate(SAMPLE)
        stamp = seen["last"].split(" ", 1)[0]
        seen["age"] = time.time() - float(stamp) if stamp.replace(".", "").isdigit() else None
        taken.append(seen)
    return taken


def check(taken: list[dict]) -> None:
    blank = [s for s in taken if not s["lines"]]
    old = [s for s in taken if s["age"] is None or s["age"] > MAX_AGE]
    print("samples:", [(s["lines"], s["marker"], None if s["age"] is None else round(s["age"], 2)) for s in taken])
    assert not blank, f"{len(blank)} of {len(taken)} samples showed no log line"
    assert not old, f"{len(old)} of {len(taken)} samples showed a newest line older than {MAX_AGE} s"
    assert any(s["marker"] for s in taken)  # it fell behind, and says so


def running(job: Job) -> Job:
    return services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.RUNNING, reason="Started",
                                   message="")


@pytest.mark.parametrize("opened", ["while it runs", "before it starts"])
def test_a_log_at_10_mb_per_second_always_shows_its_newest_lines(browser, asgi_server, world, submit,  # noqa: F811
                                                                  opened):
    from tests.live.conftest import admitted, pending

    job = submit("bob", "gpu-1", name="fast-writer")
    path = get_backend().log_path(job_id=job.pk, attempt_number=1, rank=0)
    if opened == "before it starts":
        pending(job)
        page = open_detail_waiting(browser, asgi_server, job.pk)
        admitted(job)
        running(job)
    else:
        admitted(job)
        running(job)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("starting\n")
        page = open_detail(browser, asgi_server, "bob", job.pk)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = Writer(path)
    writer.start()
    try:
        taken = samples(page)
    finally:
        writer.stopping.set()
        writer.join(10)
    check(taken)
    services.job_transition(job=Job.objects.get(pk=job.pk), phase=Phase.SUCCEEDED, reason="Completed", message="")
    connections.close_all()


def open_detail_waiting(browser, base: str, job_id: int):  # noqa: F811
    """The page of a job not admitted yet, its socket open: no viewer yet."""
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(base + "/login/")
    page.fill("input[name=username]", "bob")
    page.fill("input[name=password]", "pw-bob")
    page.click("button:has-text('Log in')")
    page.wait_for_url(base + "/")
    page.goto(f"{base}/jobs/{job_id}/")
    page.wait_for_function("() => window.jobsite && window.jobsite.opened >= 1")
    return page
