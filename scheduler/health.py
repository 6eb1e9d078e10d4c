"""Process-local liveness of the scheduler loop, read by the scheduler's /healthz, /readyz and /metrics.

The loop calls ``started()`` once when it starts, ``beat()`` at every round (as a standby too, or liveness fails)
and ``set_leader()`` when it gains or loses the leader lease. Times come from a monotonic clock (``_now``, which
tests may replace).
"""

from __future__ import annotations

import threading
import time

_now = time.monotonic

_lock = threading.Lock()
_started_at: float | None = None
_last_beat: float | None = None
_leader = False


def started() -> None:
    """The loop (re)starts: opens the start-up grace period of /healthz."""
    global _started_at
    with _lock:
        _started_at = _now()


def beat() -> None:
    """The loop finished a round."""
    global _last_beat
    with _lock:
        _last_beat = _now()


def set_leader(leader: bool) -> None:
    global _leader
    with _lock:
        _leader = bool(leader)


def is_leader() -> bool:
    with _lock:
        return _leader


def seconds_since_beat() -> float | None:
    """Seconds since the last ``beat()``; None before the first one."""
    with _lock:
        return None if _last_beat is None else max(0.0, _now() - _last_beat)


def seconds_since_start() -> float | None:
    """Seconds since ``started()``; None when no loop started in this process."""
    with _lock:
        return None if _started_at is None else max(0.0, _now() - _started_at)


def reset() -> None:
    """Forget everything (tests)."""
    global _started_at, _last_beat, _leader
    with _lock:
        _started_at = _last_beat = None
        _leader = False
