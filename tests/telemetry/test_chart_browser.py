"""The GPU card in real Chromium, at phone and desktop width: the charts fit the card and carry their figures."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler.telemetry.nvml import NvmlSampler
from scheduler.telemetry.step import telemetry_round
from tests.browser import ARTIFACTS
from tests.ui import test_layout as layout

from .fake_nvml import FakeNvml
from .test_step import device, running_on

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
live_asgi_server, shared_browser, open_page = layout.live_asgi_server, layout.shared_browser, layout.open_page


class Wave(FakeNvml):
    """GPU 0 ramps through an epoch and back; GPU 1 sits idle."""

    def __init__(self):
        super().__init__([device(0), device(0)])
        self.step = 0

    def tick(self):
        self.step += 1
        busy = [5, 40, 95, 97, 96, 98, 60, 20, 90, 99][self.step % 10]
        self.devices[0] = dict(self.devices[0], util_gpu=busy, memory_used=(30 + busy // 2) << 30)


@pytest.mark.parametrize("name, viewport", [("phone", {"width": 390, "height": 844}),
                                            ("desktop", {"width": 1280, "height": 900})])
def test_gpu_charts_fit_and_show_figures(open_page, submit, name, viewport):
    job = running_on(submit, [0, 1])
    fake = Wave()
    sampler = NvmlSampler(node="local", nvml=fake)
    t0 = timezone.now() - timedelta(minutes=15)
    for i in range(90):
        fake.tick()
        telemetry_round(sampler, interval=10, now=t0 + timedelta(seconds=10 * i))
    page = open_page("bob", viewport)
    page.goto(f"{page.base}/jobs/{job.pk}/")
    page.wait_for_function("() => window.jobsite && window.jobsite.received >= 1")  # the socket's first frame
    card = page.locator("#gpus-card")
    card.scroll_into_view_if_needed()
    assert card.locator("figure.gpu-chart").count() == 2
    assert "GPU 0" in card.inner_text() and "SM 0 %" in card.inner_text()
    card_box = card.bounding_box()
    for svg in card.locator("svg").all():
        box = svg.bounding_box()
        assert box["width"] > 200 and box["x"] + box["width"] <= card_box["x"] + card_box["width"] + 1
    card.screenshot(path=str(ARTIFACTS / f"gpu-{name}.png"))
    page.screenshot(path=f"/tmp/gpu-{name}.png", full_page=True)
    assert page.errors == []
