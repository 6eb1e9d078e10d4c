"""Bounded series (pure): 10 s for an hour, 1 min for a day, 10 min for the job's life."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from jobs.services.telemetry import downsample, idle_step, series_add

pytestmark = pytest.mark.fast
GIB = 1024**3


def pt(t, sm=50.0):
    return [t, sm, 10 * GIB, 80 * GIB, 300.0, 60.0]


def test_downsample_averages_each_bucket():
    out = downsample([pt(0, 10), pt(10, 30), pt(60, 90)], 60)
    assert out == [[0, 20.0, 10 * GIB, 80 * GIB, 300.0, 60.0], [60, 90.0, 10 * GIB, 80 * GIB, 300.0, 60.0]]


H, D = 3600, 86400
NOW = 1_700_006_400  # a multiple of 6 h


@pytest.mark.parametrize("rows, points, now, written, deleted", [
    # the first point makes its minute's 10 s row; the next of that minute is appended to it
    ({}, [pt(NOW + 5)], NOW + 5, {(10, NOW): [pt(NOW + 5)]}, set()),
    ({(10, NOW): [pt(NOW + 5)]}, [pt(NOW + 15)], NOW + 15, {(10, NOW): [pt(NOW + 5), pt(NOW + 15)]}, set()),
    # a 10 s row an hour old becomes one 1 min point of its 10 min row, and goes
    ({(10, NOW - H - 60): [pt(NOW - H - 60, 10), pt(NOW - H - 50, 30)], (10, NOW): []}, [pt(NOW)], NOW,
     {(10, NOW): [pt(NOW)], (60, NOW - H - 600): [pt(NOW - H - 60, 20)]}, {(10, NOW - H - 60)}),
    # not yet: its last 10 s are still within the hour
    ({(10, NOW - H - 50): [pt(NOW - H - 50)]}, [pt(NOW)], NOW, {(10, NOW): [pt(NOW)]}, set()),
    # appended to the 10 min row it falls in, in time order
    ({(10, NOW - H - 60): [pt(NOW - H - 60, 10)], (60, NOW - H - 600): [pt(NOW - H - 600, 50)]}, [pt(NOW)], NOW,
     {(10, NOW): [pt(NOW)], (60, NOW - H - 600): [pt(NOW - H - 600, 50), pt(NOW - H - 60, 10)]},
     {(10, NOW - H - 60)}),
    # a 10 min row of 1 min points a day old becomes one 10 min point of its 6 h row
    ({(60, NOW - D - 600): [pt(NOW - D - 600, 40), pt(NOW - D - 540, 60)]}, [pt(NOW)], NOW,
     {(10, NOW): [pt(NOW)], (600, NOW - D - 21600): [pt(NOW - D - 600, 50)]}, {(60, NOW - D - 600)}),
    # after a gap of days a 10 s row folds through both levels
    ({(10, NOW - 2 * D): [pt(NOW - 2 * D, 70)]}, [pt(NOW)], NOW,
     {(10, NOW): [pt(NOW)], (600, NOW - 2 * D): [pt(NOW - 2 * D, 70)]}, {(10, NOW - 2 * D)}),
])
def test_series_add(rows, points, now, written, deleted):
    assert series_add(rows, points, now) == (written, deleted)


def test_a_gpu_day_stays_a_few_kb_and_each_round_writes_little():
    """Two days of 10 s rounds through ``series_add``, the rows kept as the database would."""
    rows: dict = {}
    biggest_write = 0
    for t in range(NOW, NOW + 2 * D, 10):
        touched = {k: v for k, v in rows.items() if k == (10, t // 60 * 60) or k[1] <= t - H - 60 or k[0] == 600}
        written, deleted = series_add(touched, [pt(t, t % 100)], now=t)
        biggest_write = max(biggest_write, len(json.dumps(written[(10, t // 60 * 60)])))  # the round's own row
        rows.update(written)
        for key in deleted:
            del rows[key]
    assert max(len(v) for k, v in rows.items() if k[0] == 10) <= 6
    assert len([k for k in rows if k[0] == 10]) == 61  # the last hour, a row a minute
    assert len([k for k in rows if k[0] == 60]) == 23 * 6 + 1  # the day before it, a row per 10 min
    long_term = [v for k, v in rows.items() if k[0] == 600]
    assert len(long_term) == 4 and all(len(v) <= 36 for v in long_term)  # the first day, in 6 h rows
    assert sum(len(v) for v in long_term) == 143  # the first day but its last 10 min, still at 1 min
    assert len(json.dumps(long_term)) < 9_000  # ~8 KB of JSON a GPU-day for the job's life (bench: as stored)
    assert biggest_write < 400  # six 10 s points (a 10 min or 6 h row: once a minute or once in 10 min)


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
