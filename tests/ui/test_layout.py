"""Every page on a phone (390×844) and a wide screen (1440×900), light and dark, in a real browser: nothing wider than
the viewport, status badges at WCAG AA contrast, no console error, the narrow menu, the job cards, the "Queues"
menu, local times, the focus after a failed submit; and an oversized command that keeps the form."""

from __future__ import annotations

import os
import time
from datetime import UTC, timedelta, timezone

import pytest
from django.urls import reverse

from jobs import services
from jobs.choices import Phase
from jobs.limits import COMMAND_MAX_BYTES
from jobs.models import Job
from tests.browser import ARTIFACTS, chromium
from tests.live import test_live_browser as live
from tests.ui.conftest import field_block

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM calls between Playwright's page actions

# The ASGI server of the live pages (uvicorn on the test database: WebSockets work, so no console error comes
# from a refused socket), under its own name.
live_asgi_server = live.asgi_server

browser_test = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1440, "height": 900}
VIEWPORTS = {"phone": PHONE, "desktop": DESKTOP}
LONG_NAME = "a-very-long-unbroken-job-name-that-goes-on-and-on-without-a-single-space-" + "x" * 40
COLOURS = {"green", "orange", "blue", "grey", "red", "lightgrey"}

# Elements whose right edge passes the viewport, leaving out those inside a box that scrolls or clips sideways
# (the wide tables' .table-wrap, the log's <pre>): those scroll on their own, the page does not.
OVERFLOWING = """() => {
  const width = document.documentElement.clientWidth;
  const clipped = (el) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      if (/(auto|scroll|hidden|clip)/.test(getComputedStyle(p).overflowX)) return true;
    }
    return false;
  };
  const out = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.height > 0 && r.right > width + 1 && !clipped(el)) {
      const name = `${el.tagName.toLowerCase()}.${String(el.className).trim().replace(/\\s+/g, '.')}`;
      out.push(`${name} right=${Math.round(r.right)}`);
    }
  }
  return {scroll: document.scrollingElement.scrollWidth, width, out: out.slice(0, 10)};
}"""

# The contrast ratio (WCAG 2) of each status badge's text on its own background, from the computed colours.
BADGE_CONTRAST = """() => {
  const rgb = (s) => s.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const lum = (c) => {
    const [r, g, b] = c.map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  return [...document.querySelectorAll('.badge')].map((el) => {
    const style = getComputedStyle(el);
    const [a, b] = [lum(rgb(style.color)), lum(rgb(style.backgroundColor))].sort((x, y) => y - x);
    return {color: (el.className.match(/badge-(\\w+)/) || [])[1], text: el.textContent.trim(),
            ratio: (a + 0.05) / (b + 0.05)};
  });
}"""


@pytest.fixture
def every_colour(world, submit, make_pending, make_admitted):
    """A job of every status colour in phusers, one of them with a long unbroken name."""
    jobs = {"orange": submit("bob", name=LONG_NAME)}
    make_pending(submit("pan", "gpu-4", name="big-sweep"), message="waiting for group GPU quota 4/4")
    jobs["green"], _ = make_admitted(submit("bob", "gpu-1", name="training-run"))
    for colour, phase, status in [("red", Phase.FAILED, "Fail"), ("blue", Phase.SUCCEEDED, "Succeeded"),
                                  ("lightgrey", Phase.UNKNOWN, "Unknown")]:
        job, _ = make_admitted(submit("bob", "gpu-1", name=f"{colour}-run"))
        services.job_transition(job=job, phase=phase, status=status, reason="Test", message=f"ended {colour}",
                                exit_code=3 if colour == "red" else None)
        jobs[colour] = job
    grey = submit("bob", name="grey-run")
    services.job_cancel(job=grey, by=world.users["bob"])
    jobs["grey"] = grey
    return jobs


@pytest.fixture(scope="module")
def shared_browser():
    with chromium() as launched:
        yield launched


@pytest.fixture
def open_page(shared_browser, live_asgi_server):
    """open_page(username, viewport, scheme="light", **context) → a logged-in page that records console errors in
    ``page.errors``."""
    from django.db import connections

    contexts = []

    def do(username: str, viewport: dict, scheme: str = "light", **options):
        context = shared_browser.new_context(viewport=viewport, color_scheme=scheme, **options)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.errors = []
        page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        page.goto(live_asgi_server + "/login/")
        page.fill("input[name=username]", username)
        page.fill("input[name=password]", f"pw-{username}")
        page.click("button:has-text('Log in')")
        page.wait_for_url(live_asgi_server + "/**")
        page.base = live_asgi_server
        return page

    yield do
    for context in contexts:
        context.close()
    connections.close_all()


def box_of(locator) -> dict:
    """The element's box, looked up again while a live swap replaces it (the list's socket re-sends rows that
    changed just before the page was drawn: between two looks the row may be a new element, not yet laid out)."""
    deadline = time.monotonic() + 15
    while (box := locator.bounding_box()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert box is not None, f"{locator} has no box"
    return box


def assert_fits(page, what: str) -> None:
    result = page.evaluate(OVERFLOWING)
    assert result["scroll"] <= result["width"], f"{what}: the page is {result['scroll']} px wide: {result['out']}"
    assert not result["out"], f"{what}: past the viewport's right edge: {result['out']}"


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", ["phone", "desktop"])
@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_every_page_fits_the_viewport_without_console_errors(open_page, every_colour, world, size, scheme):
    page = open_page("bob", VIEWPORTS[size], scheme)
    pages = {
        "list": "/",
        "detail": reverse("jobs:detail", kwargs={"pk": every_colour["red"].pk}),
        "detail-long-name": reverse("jobs:detail", kwargs={"pk": every_colour["orange"].pk}),
        "submit": reverse("jobs:submit"),
        "queue": reverse("jobs:queue", kwargs={"name": "phusers"}),
        "utilisation": reverse("jobs:utilisation"),
        "usage": reverse("jobs:usage"),
    }
    for name, path in pages.items():
        page.goto(page.base + path)
        assert_fits(page, f"{name} ({size}, {scheme})")
        page.screenshot(path=str(ARTIFACTS / f"layout-{name}-{size}-{scheme}.png"), full_page=True)

    admin = open_page("admin", VIEWPORTS[size], scheme)
    admin.goto(admin.base + reverse("admin:jobs_group_change", args=[world.groups["phusers"].pk]))
    assert_fits(admin, f"admin group page ({size}, {scheme})")
    admin.screenshot(path=str(ARTIFACTS / f"layout-admin-group-{size}-{scheme}.png"), full_page=True)

    assert page.errors == [] and admin.errors == []


@pytest.mark.parametrize("size", ["phone", "desktop"])
@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_login_page_fits(shared_browser, live_asgi_server, size):
    context = shared_browser.new_context(viewport=VIEWPORTS[size])
    try:
        page = context.new_page()
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(live_asgi_server + "/login/")
        assert_fits(page, f"login ({size})")
        assert page.locator("input[name=username]").is_visible()
        page.screenshot(path=str(ARTIFACTS / f"layout-login-{size}.png"), full_page=True)
        assert errors == []
    finally:
        context.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_status_badges_meet_wcag_aa_contrast(open_page, every_colour, scheme):
    page = open_page("bob", DESKTOP, scheme)
    badges = page.evaluate(BADGE_CONTRAST)
    assert {b["color"] for b in badges} == COLOURS  # every colour is on the page
    low = [b for b in badges if b["ratio"] < 4.5]
    assert not low, f"badges under 4.5:1 in {scheme}: {low}"
    # The hues are Run:ai's in both schemes (DESIGN.md §2).
    # Read in one go from the row in the page (the page's socket may swap the rows in again as it connects).
    background = page.wait_for_function(
        "id => { const el = document.querySelector('#job-' + id + ' .badge');"
        " return el && el.isConnected && getComputedStyle(el).backgroundColor; }",
        arg=every_colour["orange"].pk).json_value()
    assert background == "rgb(253, 134, 8)"


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_phone_menu_opens_with_its_links_and_closes_on_escape(open_page, every_colour):
    page = open_page("bob", PHONE)
    menu = page.locator(".nav-button")
    links = page.locator("nav.mainnav a")
    assert menu.is_visible()
    assert not links.first.is_visible()  # folded
    menu.click()
    assert menu.get_attribute("aria-expanded") == "true"
    for text in ["Jobs", "Submit", "Queue", "Utilisation", "Usage"]:
        link = page.locator("nav.mainnav a", has_text=text).first
        assert link.is_visible(), text
        box = box_of(link)
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    assert page.locator(".account .username").inner_text() == "bob"
    assert page.locator(".account .username").is_visible()
    assert page.locator("button:has-text('Log out')").is_visible()
    page.screenshot(path=str(ARTIFACTS / "layout-menu-phone.png"), full_page=True)
    page.keyboard.press("Escape")
    assert menu.get_attribute("aria-expanded") == "false"
    assert not links.first.is_visible()
    menu.click()
    page.locator("nav.mainnav a", has_text="Submit").click()
    page.wait_for_url("**/jobs/new/")
    assert page.errors == []


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_phone_list_shows_each_job_as_a_card_with_its_status(open_page, every_colour):
    page = open_page("bob", PHONE)
    for colour, job in every_colour.items():
        row = page.locator(f"#job-{job.pk}")
        badge = row.locator(".badge")
        assert badge.is_visible(), colour
        box = box_of(badge)
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], colour
        assert row.locator("td.name a").is_visible()
        assert row.locator("td.group").is_visible() and row.locator("td.group").inner_text().endswith("phusers")
    waiting = page.locator("tr", has_text="big-sweep")
    assert waiting.locator("td.reason").is_visible()
    assert "in phusers" in waiting.locator("td.queue").inner_text()
    long_row = page.locator(f"#job-{every_colour['orange'].pk}")
    assert box_of(long_row)["width"] <= PHONE["width"]
    # The name keeps a readable width (the small facts go on their own line, not beside it).
    assert box_of(long_row.locator("td.name"))["width"] >= 150
    assert page.locator(f"#job-{every_colour['orange'].pk} td.name").inner_text() == LONG_NAME  # wrapped, all of it
    page.screenshot(path=str(ARTIFACTS / "layout-cards-phone.png"), full_page=True)


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_queues_menu_closes_on_escape_and_on_a_click_elsewhere(open_page, world):
    page = open_page("lin", DESKTOP)  # in two groups: a "Queues" menu
    menu = page.locator("details.navmenu")
    page.locator("details.navmenu > summary").click()
    assert menu.evaluate("el => el.open") is True
    assert page.locator(".navmenu-items a", has_text="research").is_visible()
    page.keyboard.press("Escape")
    assert menu.evaluate("el => el.open") is False
    page.locator("details.navmenu > summary").click()
    assert menu.evaluate("el => el.open") is True
    page.locator("h1").click()
    assert menu.evaluate("el => el.open") is False
    assert page.errors == []


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_times_show_in_the_readers_time_zone_with_utc_on_hover(open_page, every_colour):
    job = Job.objects.get(pk=every_colour["green"].pk)
    page = open_page("bob", DESKTOP, timezone_id="Asia/Tokyo")
    page.goto(page.base + reverse("jobs:detail", kwargs={"pk": job.pk}))
    submitted = page.locator("#status-card dt:has-text('Submitted') + dd time")
    tokyo = job.created_at.astimezone(timezone(timedelta(hours=9)))
    page.wait_for_function("el => el.hasAttribute('data-localised')", arg=submitted.element_handle())
    assert submitted.inner_text() == f"{tokyo:%Y-%m-%d %H:%M:%S}"
    utc = job.created_at.astimezone(UTC)
    assert submitted.get_attribute("title").startswith(f"{utc:%Y-%m-%d %H:%M:%S} UTC")
    # The list's "Submitted" column too, to the minute.
    page.goto(page.base + "/")
    cell = page.locator(f"#job-{job.pk} td.time time")
    page.wait_for_function("el => el.hasAttribute('data-localised')", arg=cell.element_handle())
    assert cell.inner_text() == f"{tokyo:%Y-%m-%d %H:%M}"


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_a_failed_submit_focuses_the_first_invalid_field(open_page, world):
    page = open_page("bob", PHONE)
    page.goto(page.base + reverse("jobs:submit"))
    page.fill("input[name=name]", "keeps-its-name")
    page.fill("textarea[name=command]", "python train.py")
    page.fill("textarea[name=env]", "1BAD=x")
    page.select_option("select[name=instance_type]", "gpu-4")
    page.fill("input[name=replicas]", "2")
    page.click("button:has-text('Submit job')")
    page.wait_for_selector("#field-replicas .field-errors")
    # Two fields are wrong; the environment comes first on the page: it has the focus, scrolled into view.
    assert page.locator("#field-env .field-errors").is_visible()
    assert page.evaluate("() => document.activeElement.name") == "env"
    assert page.input_value("input[name=name]") == "keeps-its-name"
    assert Job.objects.count() == 0


def test_the_server_renders_times_in_utc_saying_so(login, submit):
    job = submit("bob")
    html = login("bob").get(reverse("jobs:detail", kwargs={"pk": job.pk})).content.decode()
    utc = job.created_at.astimezone(UTC)
    assert (f'<time datetime="{utc.isoformat()}" data-local="seconds" title="{utc:%Y-%m-%d %H:%M:%S} UTC">'
            f'{utc:%Y-%m-%d %H:%M:%S} UTC</time>') in html


def test_the_first_invalid_field_has_autofocus_and_no_other(login, world):
    response = login("bob").post(reverse("jobs:submit"), {
        "group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny", "command": "", "env": "1BAD=x",
        "replicas": 1, "job_type": "training", "priority": "normal",
    })
    html = response.content.decode()
    assert "autofocus" in field_block(html, "command")
    assert "autofocus" not in field_block(html, "env")
    assert html.count("autofocus") == 1


def test_an_oversized_command_keeps_the_form_and_says_what_was_too_big(login, world):
    command = "echo " + "x" * (3 << 20)  # 3 MiB: past Django's own 2.5 MB default, within the edge's 4 MiB
    response = login("bob").post(reverse("jobs:submit"), {
        "group": "phusers", "name": "big-paste", "image": "base-notebook", "instance_type": "cpu-tiny",
        "command": command, "replicas": 1, "job_type": "training", "priority": "normal",
    })
    assert response.status_code == 200
    html = response.content.decode()
    block = field_block(html, "command")
    assert "The command is longer than 64 KiB: it is 3.0 MiB." in block
    assert 'value="big-paste"' in field_block(html, "name")  # the rest of the form is kept
    assert f'maxlength="{COMMAND_MAX_BYTES}"' in block  # the browser stops such a paste in the first place
    assert Job.objects.count() == 0
