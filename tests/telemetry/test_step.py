"""The leader's telemetry round against the database: readings stored per attempt and GPU, the attempt's means, and
idle GPUs turned into one warning, Job.gpus_idle_since and an ``idle_gpus`` notification."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import services
from jobs.choices import EventType, Phase
from jobs.models import GpuSeries, Job, Notification
from jobs.services.notifications import subscription_create
from jobs.services.telemetry import gpu_points_record, gpu_series_compact
from jobs.telemetry_selectors import gpu_timelines
from scheduler.telemetry.dcgm import dcgm_parse
from scheduler.telemetry.nvml import NvmlSampler
from scheduler.telemetry.step import telemetry_round

from .fake_nvml import FIXTURES, FakeNvml

pytestmark = [pytest.mark.django_db, pytest.mark.fast]


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.JOBSITE_NOTIFY_ALLOW_HOSTS = ["127.0.0.1"]
    settings.JOBSITE_GPU_IDLE_UTIL = 5.0
    settings.JOBSITE_GPU_IDLE_MINUTES = 30


def running_on(submit, gpu_ids, instance_type="gpu-2") -> Job:
    job = submit("bob", instance_type)
    services.job_transition(job=job, phase=Phase.PENDING)
    services.job_admit(job=job, backend="local", placement=[{"node": "local", "gpu_ids": gpu_ids}])
    services.job_transition(job=job, phase=Phase.RUNNING)
    job.refresh_from_db()
    return job


def device(util):
    return {"uuid": f"GPU-{util}", "util_gpu": util, "util_memory": 0, "memory_total": 80 << 30,
            "memory_used": 1 << 30, "memory_free": 79 << 30, "power_mw": 70000, "temperature": 30}


def test_a_round_stores_each_gpu_of_the_job_and_its_mean(submit):
    job = running_on(submit, [0, 1])
    other = running_on(submit, [2])  # placed on a GPU NVML does not list: no readings, nothing stored
    sampler = NvmlSampler(node="local", nvml=FakeNvml())
    now = timezone.now()
    assert telemetry_round(sampler, interval=10, now=now) == 1
    telemetry_round(sampler, interval=10, now=now + timedelta(seconds=10))
    timelines = gpu_timelines(job.current_attempt)
    assert [(t.gpu, len(t.points), t.points[0][1]) for t in timelines] == [("0", 2, 97.0), ("1", 2, 0.0)]
    attempt = job.current_attempt
    attempt.refresh_from_db()
    assert (attempt.gpu_samples, attempt.gpu_util_mean) == (4, 48.5)
    assert attempt.gpu_util_seconds == pytest.approx(2 * 10 * 0.97)
    assert not GpuSeries.objects.filter(attempt=other.current_attempt).exists()


def test_idle_gpus_warn_once_notify_and_clear_when_busy(submit, world):
    subscription_create(user=world.users["bob"], channel="webhook", url="http://127.0.0.1:9/hook",
                        events=["idle_gpus"])
    job = running_on(submit, [0], instance_type="gpu-1")
    fake = FakeNvml([device(1)])
    sampler = NvmlSampler(node="local", nvml=fake)
    t0 = timezone.now()
    for minute in (0, 10, 29, 30, 31, 45):
        telemetry_round(sampler, interval=10, now=t0 + timedelta(minutes=minute))
    job.refresh_from_db()
    assert job.gpus_idle_since == t0
    warnings = list(job.events.filter(type=EventType.WARNING, reason="GpusIdle"))
    assert [w.message for w in warnings] == ["GPUs idle for 30 min (every GPU under 5 %)"]
    assert Notification.objects.filter(job=job, kind="idle_gpus").count() == 1

    fake.devices = [device(60)]
    telemetry_round(sampler, interval=10, now=t0 + timedelta(minutes=50))
    job.refresh_from_db()
    assert job.gpus_idle_since is None

    fake.devices = [device(0)]  # a second spell: a second warning
    for minute in (60, 95):
        telemetry_round(sampler, interval=10, now=t0 + timedelta(minutes=minute))
    assert job.events.filter(reason="GpusIdle").count() == 2


def test_an_idle_interactive_job_is_stopped_after_the_grace_when_the_admin_asks(submit, settings):
    settings.JOBSITE_GPU_IDLE_STOP_INTERACTIVE_MINUTES = 15
    job = running_on(submit, [0], instance_type="gpu-1")
    Job.objects.filter(pk=job.pk).update(job_type="interactive")
    sampler = NvmlSampler(node="local", nvml=FakeNvml([device(0)]))
    t0 = timezone.now()
    for minute in (0, 30, 44):
        telemetry_round(sampler, interval=10, now=t0 + timedelta(minutes=minute))
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING
    telemetry_round(sampler, interval=10, now=t0 + timedelta(minutes=45))
    job.refresh_from_db()
    assert (job.phase, job.termination_target) == (Phase.TERMINATING, Phase.CANCELLED)
    assert job.events.filter(reason="GpusIdleStopped", message__startswith="Stopped: GPUs idle for 45 min").exists()


def test_batch_jobs_are_never_stopped_for_idle_gpus(submit, settings):
    settings.JOBSITE_GPU_IDLE_STOP_INTERACTIVE_MINUTES = 15
    job = running_on(submit, [0], instance_type="gpu-1")
    sampler = NvmlSampler(node="local", nvml=FakeNvml([device(0)]))
    t0 = timezone.now()
    for minute in (0, 30, 90):
        telemetry_round(sampler, interval=10, now=t0 + timedelta(minutes=minute))
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING


class RecordedScrape:
    """A DCGM sampler over the recorded scrape, its pods renamed to a job of this test."""

    source = "dcgm"

    def __init__(self, job_id: int):
        self.text = (FIXTURES / "dcgm_scrape.txt").read_text().replace('pod="job-12-1-', f'pod="job-{job_id}-1-')

    def read(self):
        return dcgm_parse(self.text)


def test_a_dcgm_scrape_is_stored_per_pod_rank(submit, settings):
    settings.JOBSITE_K8S_NAMESPACE = "jobsite"
    job = submit("bob", "gpu-1", replicas=2)
    services.job_transition(job=job, phase=Phase.PENDING)
    services.job_admit(job=job, backend="kubernetes", placement=[{"node": "gpu-node-a"}, {"node": "gpu-node-a"}])
    services.job_transition(job=job, phase=Phase.RUNNING)
    job.refresh_from_db()
    assert telemetry_round(RecordedScrape(job.pk), interval=10) == 1
    series = GpuSeries.objects.filter(attempt=job.current_attempt).order_by("rank")
    assert [(s.rank, s.node, s.gpu, s.points[-1][1]) for s in series] == [(0, "gpu-node-a", "0", 93.0),
                                                                         (1, "gpu-node-a", "1", 0.0)]


def test_the_passed_rows_of_an_ended_attempt_are_folded_to_10_min_points(submit):
    attempt = running_on(submit, [0]).current_attempt
    t0 = 1_700_006_400  # 30 min of 10 s rounds
    for i in range(180):
        gpu_points_record(attempt=attempt, readings=[(0, "local", "0", [t0 + 10 * i, i % 100, 1, 2, 3, 4])],
                          interval=10)
    assert gpu_series_compact(now=t0 + 1800) == 0  # the last hour: kept at 10 s
    assert GpuSeries.objects.filter(attempt=attempt, resolution=10).count() == 30
    assert gpu_series_compact(now=t0 + 2 * 86400) == 1  # two days on: 10 min points only, as for its life
    assert list(GpuSeries.objects.filter(attempt=attempt).values_list("resolution", flat=True)) == [600]
    assert [p[0] for p in gpu_timelines(attempt)[0].points] == [t0, t0 + 600, t0 + 1200]
    assert gpu_timelines(attempt)[0].points[0][1] == pytest.approx(29.5)  # the mean of 0..59
    assert gpu_series_compact(now=t0 + 3 * 86400) == 0
