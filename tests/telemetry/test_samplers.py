"""Samplers (pure parsing): a recorded DCGM exporter scrape, recorded NVML readings, and their attribution."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from scheduler.telemetry.attribute import RunningAttempt, attribute
from scheduler.telemetry.dcgm import dcgm_parse
from scheduler.telemetry.nvml import NvmlSampler, load_nvml

from .fake_nvml import FIXTURES, FakeNvml

pytestmark = pytest.mark.fast
MIB = 1024 * 1024


def scrape() -> str:
    return (FIXTURES / "dcgm_scrape.txt").read_text()


def test_dcgm_scrape_gives_one_reading_per_gpu_with_its_pod():
    readings = {(r.node, r.gpu): r for r in dcgm_parse(scrape())}
    assert len(readings) == 4
    busy = readings[("gpu-node-a", "0")]
    assert (busy.sm, busy.pod, busy.namespace) == (93.0, "job-12-1-0", "jobsite")
    assert busy.mem_used == 68964 * MIB and busy.mem_total == (68964 + 12086) * MIB
    assert (busy.power_w, busy.temp_c) == (287.345, 62.0)
    assert busy.uuid == "GPU-5a1b2c3d-0000-4e5f-9a0b-111111111111"
    assert readings[("gpu-node-b", "1")].pod == ""  # a free GPU: no workload labels


def test_dcgm_parse_of_nothing_is_nothing():
    assert dcgm_parse("") == []
    assert dcgm_parse("# HELP x y\n# TYPE x gauge\nx 1\n") == []


def test_dcgm_readings_go_to_our_pods_only():
    ours = RunningAttempt(attempt_id=7, job_id=12, number=1, placement={})
    owned = attribute(dcgm_parse(scrape()), [ours], namespace="jobsite")
    assert sorted((rank, r.gpu, r.sm) for rank, r in owned[7]) == [(0, "0", 93.0), (1, "1", 0.0)]
    assert attribute(dcgm_parse(scrape()), [ours], namespace="elsewhere") == {}
    stale = RunningAttempt(attempt_id=8, job_id=12, number=2, placement={})  # a later attempt: not these pods
    assert attribute(dcgm_parse(scrape()), [stale], namespace="jobsite") == {}


def test_nvml_replay_reads_every_gpu_in_its_units():
    readings = NvmlSampler(node="local", nvml=FakeNvml()).read()
    assert [(r.gpu, r.sm, r.power_w, r.temp_c) for r in readings] == [("0", 97.0, 351.207, 66.0),
                                                                      ("1", 0.0, 69.811, 31.0)]
    assert readings[0].mem_used == 71940702208 and readings[0].mem_total == 85520809984
    assert readings[0].uuid.startswith("GPU-0f1e")


def test_nvml_readings_go_to_the_attempt_placed_on_those_gpus():
    readings = NvmlSampler(node="local", nvml=FakeNvml()).read()
    a = RunningAttempt(attempt_id=1, job_id=3, number=1, placement={"0": {"node": "local", "gpu_ids": [1]}})
    b = RunningAttempt(attempt_id=2, job_id=4, number=1, placement={"0": {"node": "other", "gpu_ids": [0]}})
    owned = attribute(readings, [a, b])
    assert list(owned) == [1] and [(rank, r.gpu) for rank, r in owned[1]] == [(0, "1")]


def test_without_nvml_the_sampler_reports_nothing(monkeypatch):
    # No NVIDIA driver: nvidia-ml-py imports, nvmlInit fails (as on virtual GPUs), and no figure is made up.
    class NoDriver(Exception):
        pass

    def init():
        raise NoDriver("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=init))
    assert load_nvml() is None
    assert NvmlSampler(node="local").read() == []
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed at all
    assert load_nvml() is None


def test_attribution_follows_the_backends_pod_names():
    from scheduler.backends.k8s_manifest import pod_name
    from scheduler.telemetry.samples import GpuReading

    reading = GpuReading(node="n", gpu="3", sm=50.0, mem_used=1, mem_total=2, power_w=1.0, temp_c=1.0,
                         pod=pod_name(41, 2, 5), namespace="jobsite")
    owned = attribute([reading], [RunningAttempt(attempt_id=9, job_id=41, number=2, placement={})])
    assert [(rank, r.gpu) for rank, r in owned[9]] == [(5, "3")]
