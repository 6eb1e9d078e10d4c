"""Bounded series (pure): 10 s for an hour, 1 min for a day, 10 min for the job's life."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from jobs.services.telemetry import downsample, idle_step, tiers_add

pytestmark = pytest.mark.fast
GIB = 1024**3


def pt(t, sm=50.0):
    return [t, sm, 10 * GIB, 80 * GIB, 300.0, 60.0]


def test_downsample_averages_each_bucket():
    out = downsample([pt(0, 10), pt(10, 30), pt(60, 90)], 60)
    assert out == [[0, 20.0, 10 * GIB, 80 * GIB, 300.0, 60.0], [60, 90.0, 10 * GIB, 80 * GIB, 300.0, 60.0]]


def test_a_gpu_day_stays_a_few_kb():
    tiers: dict = {}
    start = 1_700_000_000
    for minute in range(0, 2 * 86400, 60):  # two days of 10 s samples, handed over a minute at a time
        batch = [pt(start + minute + s, (minute + s) % 100) for s in range(0, 60, 10)]
        tiers = tiers_add(tiers, batch, now=batch[-1][0])
    assert len(tiers[10]) <= 361 and len(tiers[60]) <= 24 * 60 + 1
    assert len(tiers[600]) == pytest.approx(86400 // 600, abs=2)  # the first day
    size = len(json.dumps(tiers[10])) + len(json.dumps(tiers[60])) + len(json.dumps(tiers[600]))
    assert size < 150_000  # the finest hour and day dominate; the life-long tier grows ~10 KB a day
    assert len(json.dumps(tiers[600])) < 12_000


T0 = datetime(2026, 1, 1, tzinfo=UTC)
M = timedelta(minutes=1)


@pytest.mark.parametrize("busiest, since, now, warned, interactive, stop, expect", [
    (None, None, T0, False, False, None, (None, False, False)),              # no reading: nothing changes
    (None, T0, T0 + 40 * M, False, False, None, (T0, False, False)),
    (80.0, T0, T0 + 40 * M, False, False, None, (None, False, False)),        # busy again: the spell ends
    (2.0, None, T0, False, False, None, (T0, False, False)),                  # idle starts now
    (2.0, T0, T0 + 29 * M, False, False, None, (T0, False, False)),           # not yet 30 min
    (4.9, T0, T0 + 30 * M, False, False, None, (T0, True, False)),            # 30 min: warn
    (4.9, T0, T0 + 45 * M, True, False, None, (T0, False, False)),            # once per spell
    (5.0, T0, T0 + 45 * M, True, False, None, (None, False, False)),          # at the threshold: busy
    (1.0, T0, T0 + 45 * M, True, True, 20.0, (T0, False, False)),             # interactive, within the grace
    (1.0, T0, T0 + 50 * M, True, True, 20.0, (T0, False, True)),              # ... after it: stop
    (1.0, T0, T0 + 90 * M, True, False, 20.0, (T0, False, False)),            # batch jobs are never stopped
    (1.0, T0, T0 + 90 * M, True, True, None, (T0, False, False)),             # stopping off by default
])
def test_idle_rule(busiest, since, now, warned, interactive, stop, expect):
    step = idle_step(busiest=busiest, idle_since=since, now=now, threshold=5.0, minutes=30, warned=warned,
                     interactive=interactive, stop_minutes=stop)
    assert (step.idle_since, step.warn, step.stop) == expect
