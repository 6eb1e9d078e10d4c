"""Printing: tables with statuses in the UI's colours (ANSI 24-bit), JSON and YAML."""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import UTC, datetime
from typing import Any

import yaml

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def color_enabled(mode: str, stream=None) -> bool:
    """``always`` / ``never``; ``auto``: only to a terminal, and not when $NO_COLOR is set (https://no-color.org)."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    if os.environ.get("NO_COLOR"):
        return False
    stream = stream or sys.stdout
    return hasattr(stream, "isatty") and stream.isatty()


class Printer:
    def __init__(self, fmt: str = "table", color: bool = False, out=None):
        self.fmt = fmt
        self.color = color
        self.out = out or sys.stdout

    # --- colour -------------------------------------------------------------------------------------------

    def paint(self, text: str, hex_color: str | None) -> str:
        if not self.color or not hex_color or not re.fullmatch(r"#[0-9a-fA-F]{6}", hex_color):
            return text
        r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
        return f"\x1b[38;2;{r};{g};{b}m{text}\x1b[0m"

    def status(self, item: dict) -> str:
        return self.paint(str(item.get("status") or item.get("phase") or ""), item.get("color"))

    def bold(self, text: str) -> str:
        return f"\x1b[1m{text}\x1b[0m" if self.color else text

    # --- structured -----------------------------------------------------------------------------------------

    def data(self, value: Any) -> bool:
        """Print ``value`` as JSON or YAML when asked for; False when the caller should print a table."""
        if self.fmt == "json":
            self.out.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
            return True
        if self.fmt == "yaml":
            self.out.write(yaml.safe_dump(value, sort_keys=False, allow_unicode=True, default_flow_style=False))
            return True
        return False

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")

    def table(self, headers: list[str], rows: list[list[Any]], max_width: int = 60) -> None:
        cells = [[_cell(v, max_width) for v in row] for row in rows]
        widths = [len(h) for h in headers]
        for row in cells:
            for i, value in enumerate(row):
                widths[i] = max(widths[i], visible_len(value))
        self.line(self.bold("  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip()))
        for row in cells:
            padded = [v + " " * (widths[i] - visible_len(v)) for i, v in enumerate(row)]
            self.line("  ".join(padded).rstrip())

    def fields(self, pairs: list[tuple[str, Any]]) -> None:
        width = max((len(k) for k, _ in pairs), default=0)
        for key, value in pairs:
            text = "" if value is None else str(value)
            lines = text.splitlines() or [""]
            self.line(f"{(key + ':').ljust(width + 1)} {lines[0]}".rstrip())
            for more in lines[1:]:
                self.line(" " * (width + 2) + more)


def visible_len(text: str) -> int:
    return len(ANSI.sub("", text))


def _cell(value: Any, max_width: int) -> str:
    if value is None:
        return "-"
    text = " ".join(str(value).split()) if not ANSI.search(str(value)) else str(value)
    if visible_len(text) > max_width and not ANSI.search(text):
        text = text[: max_width - 1] + "…"
    return text


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def age(value: str | None, now: datetime | None = None) -> str:
    when = parse_time(value)
    if when is None:
        return "-"
    now = now or datetime.now(UTC)
    seconds = max(int((now - when).total_seconds()), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def amount(resource: str, value: int | None) -> str:
    if value is None:
        return "∞"
    if resource == "memory":
        gib = value / (1 << 30)
        return f"{gib:g}Gi" if gib >= 1 else f"{value / (1 << 20):g}Mi"
    if resource == "cpu":
        return f"{value / 1000:g}"
    return str(value)
