"""A real GPU's readings (an NVIDIA H200, driver 580, recorded through NvmlSampler by bench/nvml_record.py: idle, a
bf16 matrix multiply, idle again with its memory still held), replayed: the sampler reads them as it did on the card,
busy reads busy, idle reads idle, and the idle-GPU rule warns once after the work stops."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime, timedelta

import pytest

from jobs.services.telemetry import idle_step
from scheduler.telemetry.nvml import NvmlSampler

from .fake_nvml import FIXTURES, FakeNvml

pytestmark = pytest.mark.fast

RECORDING = json.loads((FIXTURES / "nvml_h200_recording.json").read_text())
SAMPLES = RECORDING["samples"]
GIB = 2**30


def replayed(sample: dict) -> list[dict]:
    return [asdict(r) for r in NvmlSampler(node="recorded", nvml=FakeNvml(sample["devices"])).read()]


def test_the_replay_reads_what_the_sampler_read_on_the_card():
    assert RECORDING["gpu"] == "NVIDIA H200" and len(SAMPLES) > 40
    for sample in SAMPLES:
        assert replayed(sample) == sample["sampler"]


def test_a_matrix_multiply_reads_busy_and_idle_reads_idle_with_the_memory_still_held():
    first_busy = next(i for i, s in enumerate(SAMPLES) if s["sampler"][0]["sm"] >= 90)
    assert SAMPLES[first_busy]["phase"] == "matmul"  # after CUDA's start-up, which reads idle
    working = [s["sampler"][0] for s in SAMPLES[first_busy:] if s["phase"] == "matmul"]
    assert len(working) >= 8 and all(r["sm"] >= 90 and r["power_w"] > 400 for r in working)
    before = [s["sampler"][0] for s in SAMPLES if s["phase"] == "idle"]
    assert all(r["sm"] == 0 and r["power_w"] < 150 for r in before)
    # NVML's utilisation is an average over its last sample period: the first reading after the work lags.
    after = [s["sampler"][0] for s in SAMPLES if s["phase"] == "idle-after"][1:]
    assert all(r["sm"] == 0 for r in after)
    assert all(r["mem_used"] > before[0]["mem_used"] + GIB for r in after)  # idle, but holding its tensors
    assert all(r["mem_total"] > 140 * GIB for r in before + working + after)


def test_the_idle_rule_warns_once_after_the_work_stops():
    start = datetime(2026, 11, 27, tzinfo=UTC)
    first_busy = next(i for i, s in enumerate(SAMPLES) if s["sampler"][0]["sm"] >= 90)
    idle_since, warned, warnings = None, False, []
    for sample in SAMPLES[first_busy:]:
        now = start + timedelta(seconds=sample["t"])
        step = idle_step(busiest=max(r["sm"] for r in sample["sampler"]), idle_since=idle_since, now=now,
                         threshold=5.0, minutes=3 / 60, warned=warned)
        if step.warn:
            warnings.append(sample["t"])
        idle_since, warned = step.idle_since, (warned or step.warn) and step.idle_since is not None
    went_idle = next(s["t"] for s in SAMPLES[first_busy:] if s["sampler"][0]["sm"] < 5)
    assert len(warnings) == 1 and 3.0 <= warnings[0] - went_idle < 3.6
