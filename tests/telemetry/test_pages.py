"""Where people see GPU telemetry: the detail page's GPU card, the attempts table, the list's idle badge, and
/api/v1/jobs/{id}/gpu-metrics/ (others' jobs are a 404)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from jobs.models import Job
from scheduler.telemetry.nvml import NvmlSampler
from scheduler.telemetry.step import telemetry_round
from tests.api.conftest import client_for  # noqa: F401 (a fixture)

from .fake_nvml import FakeNvml
from .test_step import device, running_on

pytestmark = [pytest.mark.django_db, pytest.mark.fast]


def sampled(submit, rounds=3, nvml=None):
    job = running_on(submit, [0, 1])
    sampler = NvmlSampler(node="local", nvml=nvml or FakeNvml())
    t0 = timezone.now()
    for i in range(rounds):
        telemetry_round(sampler, interval=10, now=t0 + timedelta(seconds=10 * i))
    job.refresh_from_db()
    return job


def test_detail_page_charts_each_gpu_and_the_attempt_mean(submit, login):
    job = sampled(submit)
    page = login("bob").get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert page.count('<figure class="gpu-chart">') == 2
    assert "SM 97 %" in page and "SM 0 %" in page and "67.0 / 80 GiB" in page
    assert 'class="num gpu-util">48 %' in page or 'class="num gpu-util">49 %' in page


def test_virtual_gpus_say_there_is_no_telemetry(submit, login):
    job = running_on(submit, [0, 1])
    page = login("bob").get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert "No GPU telemetry (virtual GPUs)" in page
    assert "<figure" not in page and 'class="num gpu-util"><span class="muted"' in page


def test_cpu_jobs_have_no_gpu_card(submit, login):
    job = submit("bob", "cpu-tiny")
    page = login("bob").get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert 'id="gpus-card"' not in page


def test_list_shows_idle_badge_only_while_idle(submit, login, settings):
    settings.JOBSITE_GPU_IDLE_MINUTES = 30
    job = sampled(submit, rounds=1, nvml=FakeNvml([device(0), device(1)]))
    client = login("bob")
    assert 'class="over-quota gpus-idle"' not in client.get(reverse("jobs:list")).content.decode()  # just paused
    Job.objects.filter(pk=job.pk).update(gpus_idle_since=timezone.now() - timedelta(minutes=31))
    assert 'class="over-quota gpus-idle"' in client.get(reverse("jobs:list")).content.decode()
    telemetry_round(NvmlSampler(node="local", nvml=FakeNvml([device(90), device(0)])), interval=10)
    assert 'class="over-quota gpus-idle"' not in client.get(reverse("jobs:list")).content.decode()


def test_api_gives_points_per_gpu_and_404_to_others(submit, client_for):  # noqa: F811
    job = sampled(submit)
    url = f"/api/v1/jobs/{job.pk}/gpu-metrics/"
    data = client_for("bob").get(url).json()
    assert (data["job"], data["attempt"], data["telemetry"], data["gpu_samples"]) == (job.pk, 1, True, 6)
    assert [(g["rank"], g["gpu"], len(g["points"]), g["points"][-1][1]) for g in data["gpus"]] == [
        (0, "0", 3, 97.0), (0, "1", 3, 0.0)]
    assert client_for("eve").get(url).status_code == 404
    assert client_for("bob").get(url + "?attempt=9").status_code == 404
    assert client_for("bob").get(url + "?attempt=x").status_code == 400
