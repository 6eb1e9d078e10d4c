"""On a phone (390×844) nothing is smaller than a fingertip: every visible button, link button, form control,
checkbox (or the label around it) and disclosure of the job list, a job's page and the submit form is at least
44×44 px, and every piece of text is at least 14 px. On a wide screen the compact layout stays as it was."""

from __future__ import annotations

import os

import pytest
from django.urls import reverse

from jobs import services
from jobs.choices import Phase
from jobs.models import Job
from scheduler.backend_factory import get_backend
from tests.browser import ARTIFACTS
from tests.ui import test_layout as layout

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM calls between Playwright's page actions

# The browser, the ASGI server and the logged-in pages of the layout tests.
live_asgi_server, shared_browser, open_page = layout.live_asgi_server, layout.shared_browser, layout.open_page

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1360, "height": 900}
MIN_TARGET = 44
MIN_TEXT = 14

# What a finger taps, and what it really hits: a checkbox inside a label is hit through the label.
MEASURE = """([minTarget, minText]) => {
  const shown = (el) => {
    if (!el.checkVisibility({visibilityProperty: true, opacityProperty: true})) return false;
    const r = el.getBoundingClientRect();
    if (r.width < 2 || r.height < 2) return false;
    // Visually hidden (a 1×1 box that clips, as the phone list's table head): not there for a finger or an eye.
    for (let p = el.parentElement; p; p = p.parentElement) {
      const b = p.getBoundingClientRect();
      if ((b.width < 2 || b.height < 2) && getComputedStyle(p).overflow !== 'visible') return false;
    }
    return true;
  };
  const name = (el) => {
    const text = (el.innerText || el.value || el.getAttribute('aria-label') || '').trim().slice(0, 30);
    return `${el.tagName.toLowerCase()}${el.className ? '.' + String(el.className).trim().split(/\\s+/).join('.') : ''}`
      + `${el.type ? '[' + el.type + ']' : ''} "${text}"`;
  };
  const TARGETS = 'button, a.btn, input:not([type=hidden]), select, textarea, summary, .pagination a, .mainnav a,'
    + ' a.queue-pos, .log-link, a[data-open-log], table.jobs td a, .footer a';
  const targets = [];
  for (const el of document.querySelectorAll(TARGETS)) {
    if (!shown(el)) continue;
    const hit = el.matches('input[type=checkbox], input[type=radio]') ? (el.closest('label') || el) : el;
    const r = hit.getBoundingClientRect();
    targets.push({name: name(el), width: Math.round(r.width * 10) / 10, height: Math.round(r.height * 10) / 10});
  }
  const texts = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!node.textContent.trim() || !el || el.closest('script, style, template, noscript, option')) continue;
    if (!shown(el)) continue;
    const size = parseFloat(getComputedStyle(el).fontSize);
    texts.push({name: name(el), text: node.textContent.trim().slice(0, 30), size});
  }
  return {
    targets: targets.length, smallestTarget: Math.min(...targets.map((t) => Math.min(t.width, t.height))),
    tooSmall: targets.filter((t) => t.width < minTarget || t.height < minTarget),
    texts: texts.length, smallestText: Math.min(...texts.map((t) => t.size)),
    tooSmallText: texts.filter((t) => t.size < minText),
  };
}"""


@pytest.fixture
def jobs_of_every_kind(world, submit):
    """Enough jobs for two pages of the list; one running with a log, one failed, one waiting in the queue."""
    from tests.live.conftest import admitted

    waiting = submit("pan", "gpu-4", name="big-sweep")
    services.job_transition(job=waiting, phase=Phase.PENDING, reason="GroupQuota",
                            message="waiting for group GPU quota 4/4")
    running, _ = admitted(submit("bob", "gpu-1", name="training-run"))
    services.job_transition(job=Job.objects.get(pk=running.pk), phase=Phase.RUNNING, reason="Started", message="")
    path = get_backend().log_path(job_id=running.pk, attempt_number=1, rank=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"step {i}: loss {1 / (i + 1):.4f}\n" for i in range(40)))
    failed, _ = admitted(submit("bob", "gpu-1", name="failed-run"))
    services.job_transition(job=Job.objects.get(pk=failed.pk), phase=Phase.FAILED, status="Fail", reason="Error",
                            message="exit 3", exit_code=3)
    for i in range(50):
        submit("bob", name=f"sweep-{i:02d}")
    return {"waiting": waiting, "running": running, "failed": failed}


def measure(page, what: str) -> dict:
    result = page.evaluate(MEASURE, [MIN_TARGET, MIN_TEXT])
    assert result["targets"] and result["texts"], what
    return result


def test_phone_targets_are_fingertip_sized_and_text_is_readable(open_page, jobs_of_every_kind):
    page = open_page("bob", PHONE)
    running = jobs_of_every_kind["running"]
    pages = {
        "list": "/",
        "list-menu": "/",
        "detail-running": reverse("jobs:detail", kwargs={"pk": running.pk}),
        "detail-failed": reverse("jobs:detail", kwargs={"pk": jobs_of_every_kind["failed"].pk}),
        "submit": reverse("jobs:submit"),
    }
    report = {}
    for name, path in pages.items():
        page.goto(page.base + path)
        page.wait_for_function("() => window.jobsite && window.jobsite.ready")
        if name == "list-menu":
            page.locator(".nav-button").click()
            page.locator(".mainnav a", has_text="Submit").wait_for()
        if name == "detail-running":  # the log viewer's toolbar (shown by its script) is measured too
            page.locator("#log-1-0 .log-toolbar").wait_for()
        if name == "submit":  # and the YAML spec's part, unfolded
            page.locator("#yaml-spec > summary").click()
            page.locator("#yaml-spec textarea").wait_for()
        page.screenshot(path=str(ARTIFACTS / f"phone-{name}.png"), full_page=True)
        report[name] = measure(page, name)

    summary = {name: (r["smallestTarget"], r["smallestText"]) for name, r in report.items()}
    for name, r in report.items():
        assert not r["tooSmall"], f"{name}: targets under {MIN_TARGET} px: {r['tooSmall'][:8]} ({summary})"
        assert not r["tooSmallText"], f"{name}: text under {MIN_TEXT} px: {r['tooSmallText'][:8]} ({summary})"
    assert page.errors == []


def test_a_row_is_selected_by_a_tap_anywhere_on_its_checkbox_target(open_page, jobs_of_every_kind):
    page = open_page("bob", PHONE)
    box = page.locator("#job-rows input[name=ids]").first
    rect = box.bounding_box()
    assert rect["width"] >= MIN_TARGET and rect["height"] >= MIN_TARGET
    # The edges of the target, well away from the box drawn in its middle, still tick it.
    page.mouse.click(rect["x"] + 3, rect["y"] + rect["height"] / 2)
    assert box.is_checked()
    page.mouse.click(rect["x"] + rect["width"] / 2, rect["y"] + rect["height"] - 3)
    assert not box.is_checked()
    page.keyboard.press("Space")  # still a checkbox for the keyboard
    assert box.is_checked()
    page.screenshot(path=str(ARTIFACTS / "phone-list-selected.png"))


def test_the_wide_layout_stays_compact(open_page, jobs_of_every_kind):
    """The phone sizes apply to narrow screens only: on a desktop the list keeps its small controls and type."""
    page = open_page("bob", DESKTOP)
    page.wait_for_function("() => window.jobsite && window.jobsite.ready")
    sizes = page.evaluate("""() => {
      const box = (sel) => document.querySelector(sel).getBoundingClientRect();
      const font = (sel) => parseFloat(getComputedStyle(document.querySelector(sel)).fontSize);
      return {checkbox: box('#job-rows input[name=ids]').height, button: box('#bulk-form .btn-small').height,
              head: font('table.jobs th'), badge: font('table.jobs .badge')};
    }""")
    page.screenshot(path=str(ARTIFACTS / "desktop-list.png"), full_page=True)
    assert sizes["checkbox"] < 20 and sizes["button"] < 30, sizes
    assert sizes["head"] < MIN_TEXT and sizes["badge"] < MIN_TEXT, sizes
    for name, path, button in [
        ("detail", reverse("jobs:detail", kwargs={"pk": jobs_of_every_kind["running"].pk}), ".page-head .btn"),
        ("submit", reverse("jobs:submit"), "#submit-form .btn"),
    ]:
        page.goto(page.base + path)
        page.screenshot(path=str(ARTIFACTS / f"desktop-{name}.png"), full_page=True)
        assert 0 < page.locator(button).first.bounding_box()["height"] < 40, name
