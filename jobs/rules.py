"""Pure rules both the domain and the scheduler use: quota arithmetic, amounts as people read them, backoff delays.

No queries, no settings, no clock: plain functions of their arguments (the scheduler's decisions are built on them).
"""

from __future__ import annotations

from dataclasses import dataclass

from .choices import Priority, Resource

RESOURCES = tuple(Resource.values)

PRIORITY_NAMES = dict(Priority.choices)


@dataclass(frozen=True)
class QuotaLimits:
    """None means unlimited."""

    quota: int | None = None
    limit: int | None = None
    user_quota: int | None = None

    def ceiling(self, preemptible: bool) -> int | None:
        """Most the group may hold: its quota, or for preemptible jobs its limit (borrowing idle resources)."""
        if preemptible and self.limit is not None:
            return self.limit
        return self.quota


def priority_name(priority: int) -> str:
    return PRIORITY_NAMES.get(priority, str(priority))


def fmt_amount(resource: str, amount: int | None) -> str:
    if amount is None:
        return "unlimited"
    if resource == "gpu":
        return f"{amount} GPU"
    if resource == "cpu":
        return f"{amount / 1000:g} CPU" if amount % 100 == 0 else f"{amount}m CPU"
    gib = amount / (1 << 30)
    return f"{gib:g} GiB" if amount % (1 << 20) == 0 else f"{amount} B memory"


def fmt_duration(total: float) -> str:
    """5400 → "1h 30m", 86400 → "1d", 42 → "42s"."""
    total = int(max(total, 0))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"


def retry_delay(failures: int) -> int:
    """Seconds before retry number ``failures`` of a failed training attempt: 10 s doubling, at most 6 min."""
    return min(10 * 2 ** (failures - 1), 360)


def requeue_delay(requeues: int) -> int:
    """Seconds before an attempt requeued ``requeues`` times before may be admitted again: 60 s doubling to 1 h."""
    return min(60 * 2**requeues, 3600)


def restart_delay(restarts: int) -> int:
    """Seconds before in-place restart number ``restarts`` of an interactive job: 10 s doubling to 5 min."""
    return min(10 * 2 ** (restarts - 1), 300)
