"""Server-rendered SVG charts (no chart library): the usage page's stacked bars of GPU-hours per day."""

from __future__ import annotations

import math
from datetime import date

from django import template

register = template.Library()

# Series colours, distinct from the status colours so a chart never reads as job states.
PALETTE = ["#3b6fd1", "#e07b39", "#2f9e8f", "#c2457a", "#7a5cc7", "#8c9a2c", "#d4a21a", "#4a9bd8", "#a0522d"]
OTHERS_COLOR = "#8a93a3"


def axis(max_value: float, ticks: int = 4) -> tuple[float, float, int]:
    """A round axis for values up to ``max_value``: (top, step, decimals of the labels), the step being
    1, 2, 2.5 or 5 × 10^k and at most ``ticks`` steps high."""
    if max_value <= 0:
        max_value = 1.0
    raw = max_value / ticks
    exponent = 10.0 ** math.floor(math.log10(raw))
    m = next(m for m in (1, 2, 2.5, 5, 10) if m * exponent >= raw * (1 - 1e-9))
    step = m * exponent
    count = max(1, math.ceil(max_value / step - 1e-9))
    decimals = max(0, -math.floor(math.log10(step) + 1e-9) + (1 if m == 2.5 else 0))
    return step * count, step, decimals


def stacked_bars(days: list[date], series: list[dict], *, width: int = 960, height: int = 300,
                 max_series: int = len(PALETTE), unit: str = "GPU-h", max_labels: int = 10) -> dict:
    """Geometry of a stacked bar chart: one bar per day, one stack segment per series.

    ``series``: [{"name", "values": {day: amount}, "total"}], largest first; beyond ``max_series`` they are summed
    into one "others" series.
    """
    shown = [dict(s, color=PALETTE[i]) for i, s in enumerate(series[:max_series])]
    rest = series[max_series:]
    if rest:
        values: dict[date, float] = {}
        for s in rest:
            for day, v in s["values"].items():
                values[day] = values.get(day, 0.0) + v
        shown.append({"name": f"{len(rest)} others", "values": values, "total": sum(values.values()),
                      "color": OTHERS_COLOR})
    left, right, top, bottom = 64, 12, 28, 36
    plot_w, plot_h = width - left - right, height - top - bottom
    day_totals = [sum(s["values"].get(d, 0.0) for s in shown) for d in days]
    y_max, step, decimals = axis(max(day_totals, default=0.0))
    steps = round(y_max / step)
    ticks = [{"y": round(top + plot_h - plot_h * i / steps, 2), "label": f"{step * i:,.{decimals}f}"}
             for i in range(steps + 1)]
    slot = plot_w / max(len(days), 1)
    bar_w = max(min(slot * 0.72, 48.0), 1.0)
    bars = []
    for i, day in enumerate(days):
        x = left + i * slot + (slot - bar_w) / 2
        stacked = 0.0
        for s in shown:
            v = s["values"].get(day, 0.0)
            if v <= 0:
                continue
            h = plot_h * v / y_max
            bars.append({"x": round(x, 2), "y": round(top + plot_h - stacked - h, 2), "w": round(bar_w, 2),
                         "h": round(max(h, 0.5), 2), "color": s["color"],
                         "title": f"{day:%Y-%m-%d} · {s['name']}: {v:,.2f} {unit}"})
            stacked += h
    step = max(1, math.ceil(len(days) / max_labels))
    labels = [{"x": round(left + i * slot + slot / 2, 2), "text": f"{day:%b %d}"}
              for i, day in enumerate(days) if i % step == 0 or len(days) == 1]
    return {
        "width": width, "height": height, "left": left, "top": top, "plot_w": plot_w, "plot_h": plot_h,
        "bottom_y": top + plot_h, "right_x": left + plot_w, "label_y": top + plot_h + 18,
        "ticks": ticks, "bars": bars, "labels": labels, "legend": shown, "unit": unit, "empty": not bars,
    }


@register.inclusion_tag("jobs/_stacked_bars.html")
def stacked_bar_chart(days, series, title: str = "", unit: str = "GPU-h") -> dict:
    """The chart twice: wide, and narrow for phones (fewer day labels, so its text stays readable when the SVG is
    scaled down to a phone's width); the stylesheet shows one of them."""
    days, series = list(days), list(series)
    return {"chart": stacked_bars(days, series, unit=unit),
            "narrow": stacked_bars(days, series, unit=unit, width=420, height=260, max_labels=4),
            "title": title}
