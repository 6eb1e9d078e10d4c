"""The job page's GPU card follows the job's readings live (issue 24): a sampling round stored by the scheduler is
announced once (``jobs.services.telemetry.gpus_changed_publish``), and the detail socket redraws the card alone.
Checked at the socket and in Chromium."""

from __future__ import annotations

import os

import pytest

from scheduler.telemetry.nvml import NvmlSampler
from scheduler.telemetry.step import telemetry_round
from tests.browser import ARTIFACTS
from tests.live.test_live_browser import browser, logged_in, not_reloaded  # noqa: F401
from tests.telemetry.fake_nvml import FakeNvml
from tests.telemetry.test_step import device, running_on

from .conftest import db, frames_until

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # ORM calls between Playwright's page actions


async def drain(communicator) -> list[str]:
    """The frames that come until the socket is quiet for a while."""
    got = []
    while not await communicator.receive_nothing(timeout=0.5):
        got.append(await communicator.receive_from(timeout=5))
    return got


def a_round(sm: list[int], **kwargs) -> int:
    return telemetry_round(NvmlSampler(node="local", nvml=FakeNvml([device(u) for u in sm])), interval=10, **kwargs)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_sampling_round_redraws_the_gpu_card_alone(ws, world, submit):
    job = await db(running_on, submit, [0, 1])
    other = await db(running_on, submit, [2])
    detail, _ = await ws(f"/ws/jobs/{job.pk}/?after=0", world.users["bob"])
    opened = "".join(await frames_until(detail, lambda f: 'id="gpus-card"' in f))
    assert 'id="gpus-card" hx-swap-oob="true"' in opened and "No GPU telemetry (virtual GPUs)" in opened
    await drain(detail)  # the first draw's other frames (its events)

    assert await db(a_round, [97, 0, 40]) == 2  # both jobs' GPUs read in one round
    frame = (await frames_until(detail, lambda f: "<svg" in f))[-1]
    assert frame.startswith('<section class="card gpu-card" aria-labelledby="gpus-h" id="gpus-card" hx-swap-oob')
    assert frame.count("<section") == 1 and 'id="job-head"' not in frame  # the card alone, not the whole page
    assert "SM 97 %" in frame and "SM 0 %" in frame and "SM 40 %" not in frame  # its GPUs, not the other job's
    assert not [f for f in await drain(detail) if "gpus-card" in f]  # one round: one frame

    watcher, _ = await ws(f"/ws/jobs/{other.pk}/?after=0", world.users["bob"])
    await frames_until(watcher, lambda f: 'id="gpus-card"' in f)
    await db(a_round, [10, 20, 95])
    frame = (await frames_until(detail, lambda f: "<svg" in f))[-1]
    assert "SM 10 %" in frame and "SM 20 %" in frame
    frame = (await frames_until(watcher, lambda f: "<svg" in f))[-1]
    assert "SM 95 %" in frame and "SM 10 %" not in frame


@pytest.mark.django_db(transaction=True)
def test_a_round_announces_its_jobs_once(monkeypatch, submit):
    from jobs import live_publisher

    sent = []
    monkeypatch.setattr(live_publisher, "publish_gpu_changes", lambda ids: sent.append(sorted(ids)))
    first, second = running_on(submit, [0]), running_on(submit, [1])
    idle = running_on(submit, [5])  # no GPU 5 in the readings: nothing stored, nothing announced
    a_round([50, 60])
    assert sent == [sorted([first.pk, second.pk])] and idle.pk not in sent[0]


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_chart_changes_without_a_reload(browser, asgi_server, world, submit):  # noqa: F811
    job = running_on(submit, [0, 1])
    a_round([5, 0])
    page = logged_in(browser, asgi_server, "bob", f"/jobs/{job.pk}/")
    page.set_default_timeout(60_000)
    chart = page.locator("#gpus-card figure.gpu-chart polyline").nth(1)  # GPU 0's SM line
    before = chart.get_attribute("points")
    assert "SM 5 %" in page.locator("#gpus-card").inner_text()
    a_round([90, 0])
    page.wait_for_function("(before) => { const l = document.querySelectorAll('#gpus-card polyline')[1];"
                           " return l && l.getAttribute('points') !== before; }", arg=before)
    page.wait_for_selector("#gpus-card figcaption:has-text('SM 90 %')")
    assert page.locator("#gpus-card figure.gpu-chart").count() == 2
    assert not_reloaded(page)


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name, viewport", [("phone", {"width": 390, "height": 844}),
                                            ("desktop", {"width": 1280, "height": 800})])
def test_virtual_gpus_say_there_is_no_telemetry(browser, asgi_server, world, submit, name, viewport):  # noqa: F811
    """On a machine without NVML (this one) the real sampler reads nothing, and the page says why, at any width."""
    job = running_on(submit, [0, 1])
    assert telemetry_round(NvmlSampler(node="local"), interval=10) == 0  # the real NVML: no driver, no figures
    page = logged_in(browser, asgi_server, "bob", f"/jobs/{job.pk}/")
    page.set_viewport_size(viewport)
    card = page.locator("#gpus-card")
    card.scroll_into_view_if_needed()
    assert "No GPU telemetry (virtual GPUs)" in card.inner_text() and card.locator("svg").count() == 0
    box = card.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"]
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    page.screenshot(path=str(ARTIFACTS / f"gpu-virtual-{name}.png"), full_page=True)
