"""The usage page's utilised and idle GPU-hours, and the utilisation page's GPU heat, from stored telemetry."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.models import Attempt
from jobs.services.backend_records import nodes_record

from .test_pages import sampled
from .test_step import running_on

pytestmark = [pytest.mark.django_db, pytest.mark.fast]


def page(login, user, name, **headers):
    response = login(user).get(reverse(name), **headers)
    assert response.status_code == 200
    return response.content.decode()


def cell(html, row_start):
    """The text of the cells of the first table row beginning with ``row_start``."""
    row = re.search(re.escape(row_start) + r".*?</tr>", html, re.S).group(0)
    return [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r'<td class="num">(.*?)</td>', row, re.S)]


def test_usage_page_shows_utilised_and_idle_gpu_hours_from_telemetry(submit, login):
    job = sampled(submit, rounds=3)  # GPU 0 at 97 %, GPU 1 at 0 %, three 10 s rounds
    attempt = job.current_attempt
    Attempt.objects.filter(pk=attempt.pk).update(started_at=timezone.now() - timedelta(hours=1))
    html = page(login, "bob", "jobs:usage")
    # GPU-hours: 2 GPUs × 1 h; utilised: 3 × 10 s × 97 % / 3600; idle: GPU 1's three 10 s points
    assert cell(html, "<tr><td>phusers</td><td>bob</td>")[:2] == ["2.00", "0.01"]
    assert cell(html, '<tr data-group="phusers">') == ["2.00", "0.01", "0.01"]
    assert "Idle GPU-hours" in html and "under 5 % SM" in html
    assert "no GPU telemetry" not in re.search(r'<tr data-group="phusers">.*?</tr>', html, re.S).group(0)
    assert re.search(r"<title>(.*?)</title>", html, re.S).group(1) == "GPU usage · jobsite"  # the tables once, in body
    assert html.count('id="groups-h"') == 1


def test_usage_page_says_no_telemetry_instead_of_zero(submit, login):
    job = running_on(submit, [0, 1])  # virtual GPUs: no readings
    Attempt.objects.filter(pk=job.current_attempt.pk).update(started_at=timezone.now() - timedelta(hours=1))
    html = page(login, "bob", "jobs:usage")
    assert cell(html, "<tr><td>phusers</td><td>bob</td>")[:2] == ["2.00", "— no GPU telemetry"]
    assert cell(html, '<tr data-group="phusers">') == ["2.00", "— no GPU telemetry", "— no GPU telemetry"]


def test_utilisation_page_heat_per_gpu_and_no_telemetry(submit, login, settings):
    settings.JOBSITE_BACKEND = "local"
    nodes_record(backend="local", nodes={"local": {"gpu": 8}, "n2": {"gpu": 4}})
    html = page(login, "eve", "jobs:utilisation")
    assert re.search(r'<li data-node="local">.*?no telemetry', html, re.S)
    sampled(submit, rounds=2)
    partial = page(login, "eve", "jobs:utilisation", HTTP_HX_REQUEST="true")
    assert 'class="heat heat-busy" title="GPU 0: 97 % SM">0: 97 %' in partial
    assert 'class="heat heat-idle" title="GPU 1: 0 % SM">1: 0 %' in partial
    assert "no telemetry" not in re.search(r'<li data-node="local">.*?</li>', partial, re.S).group(0)
    assert re.search(r'<li data-node="n2">.*?no telemetry', partial, re.S)


def test_admin_gpu_usage_page_shows_the_same_figures(submit, login):
    job = sampled(submit, rounds=3)
    Attempt.objects.filter(pk=job.current_attempt.pk).update(started_at=timezone.now() - timedelta(hours=1))
    html = login("admin").get("/admin/jobs/gpuusage/").content.decode()
    right = '<td style="text-align:right">'
    assert f"<td>phusers</td><td>bob</td>{right}2.0</td>{right}0.01</td>" in html
    assert re.search(r">phusers</a></td>" + re.escape(f"{right}2.0</td>{right}0.01</td>{right}0.01</td>"), html)
    Attempt.objects.filter(pk=job.current_attempt.pk).update(gpu_samples=0)
    html = login("admin").get("/admin/jobs/gpuusage/").content.decode()
    assert f"<td>phusers</td><td>bob</td>{right}2.0</td>{right}— <span class=\"help\">no GPU telemetry</span>" in html
