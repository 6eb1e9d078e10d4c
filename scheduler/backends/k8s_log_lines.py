"""The pod log API's answers with ``timestamps=true``, read as lines: each line's RFC3339 timestamp parsed to
nanoseconds (and written back to the API's form), the timestamp taken off its content."""

from __future__ import annotations

import calendar
import re
import time

NS = 10**9

_TIMESTAMP = re.compile(rb"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?:(Z)|([+-])(\d\d):(\d\d))")


def parse_timestamp(raw: bytes) -> int | None:
    """An RFC3339 timestamp (any number of fraction digits) as ns since the epoch; None if it is not one."""
    m = _TIMESTAMP.fullmatch(raw)
    if m is None:
        return None
    seconds = calendar.timegm(tuple(int(g) for g in m.groups()[:6]) + (0, 0, 0))
    if m.group(9):
        offset = int(m.group(10)) * 3600 + int(m.group(11)) * 60
        seconds -= offset if m.group(9) == b"+" else -offset
    return seconds * NS + int((m.group(7) or b"").ljust(9, b"0"))


def format_timestamp(ns: int, *, fraction: bool = True) -> str:
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // NS))
    return f"{text}.{ns % NS:09d}Z" if fraction else text + "Z"


def timestamped_lines(data: bytes, *, truncated: bool, unended: bool,
                      default_ns: int | None) -> list[tuple[int, bytes]]:
    """An answer as (timestamp, line without it) pairs. A last line without "\n" is left out when the byte bound
    cut it, else kept only with ``unended``. A line without a timestamp (not expected) takes the one before it.
    """
    parts = data.split(b"\n")
    last = parts.pop()  # b"" when the answer ends with "\n"
    if truncated or not unended:
        last = b""
    result = []
    ts = default_ns or 0
    seconds_prefix, seconds_ns = b"", 0
    for i, line in enumerate(parts + ([last] if last else [])):
        content = line if i == len(parts) else line + b"\n"
        space = line.find(b" ")
        stamp = line[:space] if space > 0 else b""
        parsed = None
        if stamp[:19] == seconds_prefix and stamp[19:20] == b"." and stamp.endswith(b"Z"):  # the common case, fast
            fraction = stamp[20:-1]
            if fraction.isdigit() and len(fraction) <= 9:
                parsed = seconds_ns + int(fraction.ljust(9, b"0"))
        if parsed is None and stamp:
            parsed = parse_timestamp(stamp)
            if parsed is not None and stamp[19:20] == b"." and stamp.endswith(b"Z"):
                seconds_prefix, seconds_ns = stamp[:19], parsed // NS * NS
        if parsed is None:
            result.append((ts, content))
            continue
        ts = parsed
        result.append((ts, content[space + 1:]))
    return result
