"""The cursor of a pod log archive (scheduler/backends/k8s_logs.py): where the archive ends in the pod's log, kept
in ``<archive>.offset`` (JSON, replaced atomically) so that a new archiver goes on from there, and found once for an
archive written without one. ``st`` is the archiver's per-pod state (its cursor fields)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from .k8s_log_lines import format_timestamp

log = logging.getLogger(__name__)

STATE_SUFFIX = ".offset"


def state_path(path: Path) -> Path:
    """Where the cursor of the archive ``path`` is kept."""
    return path.with_name(path.name + STATE_SUFFIX)


def save_cursor(st) -> None:
    state = {"time": format_timestamp(st.last_ns) if st.last_ns is not None else None, "ns": st.last_ns,
             "count": st.count, "open": st.open_line, "size": st.size, "restarts": st.restarts,
             "at_cursor": st.at_cursor}
    target = state_path(st.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, target)


def load_cursor(st) -> None:
    st.loaded = True
    try:
        state = json.loads(state_path(st.path).read_text())
        if not isinstance(state, dict):
            raise ValueError("not an object")
    except FileNotFoundError:
        state = None
    except (OSError, ValueError) as exc:
        log.warning("ignoring the log cursor of %s: %s", st.path, exc)
        state = None
    try:
        size = st.path.stat().st_size
    except FileNotFoundError:
        size = 0
    if not size:  # a new archive (or one removed): from the start of the log, previous instances too
        st.last_ns, st.count, st.open_line, st.size, st.restarts = None, 0, False, 0, 0
        return
    if state is None:
        st.adopt, st.size = True, size
        return
    try:
        st.last_ns = None if state.get("ns") is None else int(state["ns"])
        st.count = int(state.get("count") or 0)
        st.open_line = bool(state.get("open"))
        recorded = int(state.get("size", size))
        st.restarts = None if state.get("restarts") is None else int(state["restarts"])
        st.at_cursor = bool(state.get("at_cursor", st.last_ns is not None))
    except (TypeError, ValueError) as exc:
        log.warning("ignoring the log cursor of %s: %s", st.path, exc)
        st.last_ns, st.count, st.open_line, st.restarts = None, 0, False, None
        st.adopt, st.size = True, size
        return
    if size > recorded:  # appended before a crash, before its cursor was saved: fetched again
        log.info("cutting %s back to %d bytes, as its cursor says", st.path, recorded)
        os.truncate(st.path, recorded)
        size = recorded
    st.size = size


def adopt_cursor(st, lines: list[tuple[int, bytes]]) -> None:
    """Set the cursor of an archive that has none at its last line in ``lines`` (the whole log)."""
    st.adopt = False
    with open(st.path, "rb") as f:
        f.seek(max(0, st.size - (1 << 16)))
        tail = f.read()
    st.open_line = bool(tail) and not tail.endswith(b"\n")
    end = None
    total = 0
    for i, (_ts, content) in enumerate(lines):
        total += len(content)
        if total >= st.size:
            if total == st.size and tail.endswith(content):
                end = i
            break
    if end is None:  # not a prefix of the log (rotated since?): after the first line like the archive's last
        body = tail[:-1] if tail.endswith(b"\n") else tail
        last_line = tail[len(body) - len(body.split(b"\n")[-1]):]
        end = next((i for i, (_ts, content) in enumerate(lines) if content == last_line), None)
    if end is None:
        if lines:
            log.warning("the log archive %s does not match the log of pod %s: appending the whole log",
                        st.path, st.name)
        st.last_ns, st.count = None, 0
        return
    st.last_ns, st.at_cursor = lines[end][0], True
    st.count = sum(1 for ts, _content in lines[: end + 1] if ts == st.last_ns)
    save_cursor(st)

