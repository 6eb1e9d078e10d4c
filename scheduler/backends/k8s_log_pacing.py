"""How fast the pod log API is asked: a request budget per second shared by all pods, the order in which pods
waiting for it are served, and how long a failed request waits.

``RequestBudget`` spaces requests evenly (``rate`` a second, no burst): a request may start once the clock has
reached the budget's next slot, and every request, let through or forced (``finish``, which must not wait), moves
that slot on by ``1 / rate``; a forced request thus delays the polling that follows. ``PodQueue`` holds the pods
that are due and waiting for the budget: those that wrote lines recently (or asked to be preferred: rank 0) come
first, each class round-robin (first in, first out; a pod is queued at most once).
"""

from __future__ import annotations

import email.utils
import time
from collections import deque
from collections.abc import Callable, Hashable

from kubernetes.client.exceptions import ApiException

MAX_RETRY_AFTER = 600.0


class RequestBudget:
    """At most ``rate`` requests a second, evenly spaced; ``rate`` <= 0: no bound. ``clock``: seconds, monotonic."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.clock = clock
        self._next = float("-inf")

    @property
    def bounded(self) -> bool:
        return self.rate > 0

    def try_take(self) -> bool:
        """Take a request's slot if its time has come."""
        if not self.bounded:
            return True
        now = self.clock()
        if now < self._next:
            return False
        self._next = max(now, self._next) + 1.0 / self.rate
        return True

    def force(self) -> None:
        """Count a request that may not wait: the next ones wait for it."""
        if self.bounded:
            self._next = max(self.clock(), self._next) + 1.0 / self.rate

    def wait_seconds(self) -> float:
        """How long until the next slot (0: now)."""
        return max(0.0, self._next - self.clock()) if self.bounded else 0.0


class PodQueue:
    """Pods waiting for the budget: preferred ones first, each class first in, first out; each pod once."""

    def __init__(self) -> None:
        self._hot: deque[Hashable] = deque()
        self._cold: deque[Hashable] = deque()
        self._queued: set[Hashable] = set()

    def __len__(self) -> int:
        return len(self._queued)

    def __contains__(self, item: Hashable) -> bool:
        return item in self._queued

    def push(self, item: Hashable, *, hot: bool) -> None:
        if item not in self._queued:
            self._queued.add(item)
            (self._hot if hot else self._cold).append(item)

    def pop(self) -> Hashable | None:
        while self._hot or self._cold:
            item = (self._hot or self._cold).popleft()
            if item in self._queued:
                self._queued.discard(item)
                return item
        return None

    def discard(self, item: Hashable) -> None:
        self._queued.discard(item)  # its deque entry is skipped when popped


def retry_after(exc: BaseException) -> float | None:
    """The seconds an answer's Retry-After asks to wait (at most MAX_RETRY_AFTER); None without one."""
    headers = getattr(exc, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"
