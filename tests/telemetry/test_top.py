"""`jobctl top`: a row per GPU with its latest reading, or a plain "no GPU telemetry" row (and the real command
against a live server)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobctl.top import NO_TELEMETRY, top_rows
from scheduler.telemetry.nvml import NvmlSampler
from scheduler.telemetry.step import telemetry_round
from tests.cli.conftest import bob, jobctl  # noqa: F401 (fixtures)

from .fake_nvml import FakeNvml
from .test_step import running_on

GIB = 1024**3
JOB = {"id": 7, "name": "resnet"}


@pytest.mark.fast
def test_rows_show_each_gpu_latest_reading():
    metrics = {"gpu_util_mean": 48.6, "gpus_idle_since": None, "gpus": [
        {"rank": 0, "node": "n1", "gpu": "0", "points": [[1, 10, GIB, 80 * GIB, 100, 40],
                                                         [2, 97, 67 * GIB, 80 * GIB, 351.2, 66]]},
        {"rank": 0, "node": "n1", "gpu": "1", "points": []}]}
    assert top_rows(JOB, metrics) == [[7, "resnet", 0, "n1", "0", "97%", "67.0/80 GiB", "351 W", "66 C", "49%", ""]]


@pytest.mark.fast
def test_no_telemetry_is_said_plainly():
    rows = top_rows(JOB, {"gpu_util_mean": None, "gpus_idle_since": None, "gpus": []})
    assert rows == [[7, "resnet", "-", "-", "-", "-", NO_TELEMETRY, "", "", "-", ""]]


@pytest.mark.django_db(transaction=True)
def test_jobctl_top_lists_my_running_jobs_gpus(bob, submit):  # noqa: F811
    job = running_on(submit, [0, 1])
    quiet = running_on(submit, [5])  # no GPU of this one reports
    t0 = timezone.now()
    for i in range(2):
        telemetry_round(NvmlSampler(node="local", nvml=FakeNvml()), interval=10, now=t0 + timedelta(seconds=10 * i))
    result = bob("top")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:6] == ["ID", "NAME", "RANK", "NODE", "GPU", "SM"]
    mine = [line.split() for line in lines[1:] if line.split()[0] == str(job.pk)]
    assert [(row[4], row[5]) for row in mine] == [("0", "97%"), ("1", "0%")]
    assert any(line.startswith(str(quiet.pk)) and NO_TELEMETRY in line for line in lines)
