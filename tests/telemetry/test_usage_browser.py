"""The usage page's telemetry figures and the utilisation page's GPU heat in real Chromium, at phone and desktop
width: nothing pushes the page sideways and the figures are on screen."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Attempt
from jobs.services.backend_records import nodes_record
from tests.browser import ARTIFACTS
from tests.ui import test_layout as layout

from .test_pages import sampled
from .test_step import running_on

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
live_asgi_server, shared_browser, open_page = layout.live_asgi_server, layout.shared_browser, layout.open_page
VIEWPORTS = [("phone", {"width": 390, "height": 844}), ("desktop", {"width": 1280, "height": 900})]


def world_with_telemetry(submit, settings):
    settings.JOBSITE_BACKEND = "local"
    nodes_record(backend="local", nodes={"local": {"gpu": 8}, "gpu-node-b": {"gpu": 4}})
    job = sampled(submit, rounds=6)
    Attempt.objects.filter(pk=job.current_attempt.pk).update(started_at=timezone.now() - timedelta(hours=2))
    other = running_on(submit, [4, 5], instance_type="gpu-2")  # no readings of GPUs 4, 5: no telemetry
    # Two days back: a day of its own with no readings whatever the time of day (one day back shares a day with the
    # sampled job's start from midnight to 2 a.m.).
    Attempt.objects.filter(pk=other.current_attempt.pk).update(started_at=timezone.now() - timedelta(days=2))


def no_sideways(page):
    result = page.evaluate(layout.OVERFLOWING)
    assert result["out"] == [] and result["scroll"] <= result["width"], result


@pytest.mark.parametrize(("name", "viewport"), VIEWPORTS)
def test_usage_page_figures_fit(open_page, submit, settings, name, viewport):
    world_with_telemetry(submit, settings)
    page = open_page("bob", viewport)
    page.goto(f"{page.base}/usage/")
    page.locator("details.usage-days summary").click()
    groups = page.locator("table.usage-groups")
    assert "idle gpu-hours" in groups.inner_text().lower()
    assert "no gpu telemetry" in page.locator("details.usage-days").inner_text().lower()
    no_sideways(page)
    page.screenshot(path=f"/tmp/usage-{name}.png", full_page=True)
    page.screenshot(path=str(ARTIFACTS / f"usage-{name}.png"), full_page=True)
    assert page.errors == []


@pytest.mark.parametrize(("name", "viewport"), VIEWPORTS)
def test_utilisation_page_heat_fits(open_page, submit, settings, name, viewport):
    world_with_telemetry(submit, settings)
    page = open_page("bob", viewport)
    page.goto(f"{page.base}/utilisation/")
    heat = page.locator("ul.gpu-heat")
    assert heat.locator(".heat").count() == 2 and "no telemetry" in heat.inner_text()
    no_sideways(page)
    page.screenshot(path=f"/tmp/util-{name}.png", full_page=True)
    page.screenshot(path=str(ARTIFACTS / f"util-{name}.png"), full_page=True)
    assert page.errors == []
