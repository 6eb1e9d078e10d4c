"""Dependencies between jobs (``after: [{job: 12, when: ok}]``): recorded at submit, released or made impossible
when the jobs they wait for end."""

from __future__ import annotations

from datetime import datetime

from ..models import Job


def dependents_on_end(*, job: Job, now: datetime) -> None:
    """``job`` has just ended (inside its transition's transaction): settle what waits for it."""
