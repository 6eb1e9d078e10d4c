"""Pure computations behind the usage page's telemetry figures and the utilisation page's GPU heat."""

from __future__ import annotations

from datetime import date

import pytest

from jobs.telemetry_selectors import heat_cells, heat_level, idle_seconds
from jobs.usage_selectors import Figures, rollup

pytestmark = pytest.mark.fast


def pts(start, step, *sm):
    return [[start + i * step, v, 0, 0, 0, 0] for i, v in enumerate(sm)]


@pytest.mark.parametrize(("tiers", "expected"), [
    ({}, 0.0),
    ({10: pts(1000, 10, 0, 2, 50)}, 20.0),                      # two 10 s points under 5 %
    ({10: pts(1000, 10, 90, 90)}, 0.0),                         # busy all along
    ({60: pts(0, 60, 1, 80), 10: pts(120, 10, 0)}, 70.0),       # a 1 min point and a 10 s point
    ({600: pts(0, 600, 3), 60: pts(600, 60, 4, 4), 10: []}, 720.0),
    # the 10 min point overlapping where the 1 min points begin is left out, as on the chart
    ({600: pts(0, 600, 0, 0), 60: pts(900, 60, 0)}, 660.0),
    ({10: pts(0, 10, 5, 4.9)}, 10.0),                           # the threshold itself is not idle
])
def test_idle_seconds_of_one_gpu(tiers, expected):
    assert idle_seconds(tiers, 5.0) == expected


@pytest.mark.parametrize(("sm", "level"), [(0, "idle"), (4.9, "idle"), (5, "low"), (29.9, "low"), (30, "some"),
                                           (74, "some"), (75, "busy"), (100, "busy")])
def test_heat_level(sm, level):
    assert heat_level(sm, 5.0) == level


def test_heat_cells_newest_point_per_gpu_in_gpu_order():
    rows = [("n1", "10", pts(0, 10, 50)), ("n1", "2", pts(0, 10, 1, 99)), ("n2", "0", []),
            ("n1", "2", pts(100, 10, 40)), ("n1", "2", pts(0, 10, 7))]
    cells = heat_cells(rows, 5.0)
    assert list(cells) == ["n1"]  # n2's series has no point yet
    assert [(c["gpu"], c["sm"], c["level"]) for c in cells["n1"]] == [("2", 40, "some"), ("10", 50, "some")]


D1, D2 = date(2026, 3, 1), date(2026, 3, 2)
ROWS = [{"day": D1, "group": "g", "user": "a", "gpu_hours": 2.0}, {"day": D2, "group": "g", "user": "a",
        "gpu_hours": 1.0}, {"day": D1, "group": "g", "user": "b", "gpu_hours": 4.0},
        {"day": D1, "group": "h", "user": "c", "gpu_hours": 3.0}]
TELE = {(D1, "g", "a"): Figures(0, 3600.0, 1800.0, 10), (D2, "g", "a"): Figures(0, 1800.0, 0.0, 5)}


@pytest.mark.parametrize(("key", "expected"), [
    (lambda k: k[1], {"g": (7.0, 1.5, 0.5), "h": (3.0, None, None)}),
    (lambda k: k[1:], {("g", "a"): (3.0, 1.5, 0.5), ("g", "b"): (4.0, None, None), ("h", "c"): (3.0, None, None)}),
    (lambda k: k[0], {D1: (9.0, 1.0, 0.5), D2: (1.0, 0.5, 0.0)}),
])
def test_rollup_sums_and_never_invents_a_zero(key, expected):
    got = rollup(ROWS, TELE, key)
    assert {k: (f.hours, f.utilised, f.idle) for k, f in got.items()} == expected


def test_no_telemetry_at_all_is_none_not_zero():
    f = rollup(ROWS, {}, lambda k: None)[None]
    assert (f.hours, f.utilised, f.idle) == (10.0, None, None)
    assert Figures(1.0, 0.0, 0.0, 3).utilised == 0.0  # measured idle: a real 0
