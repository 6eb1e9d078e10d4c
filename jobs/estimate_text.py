"""What a pending job shows of its estimated start, on its list row and its detail page (the ``estimate`` filter)."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from .choices import Phase


def estimate_text(phase: str, position: int | None, start: datetime | None, basis: str) -> str:
    """What a pending job shows of its estimated start: "est. start 14:20 (by history)", "est. start 18:00 at the
    latest (by deadlines)", the date too when it is
    not today (in the site's time zone), or "est. start not within 30 days"; empty for any other job."""
    if phase != Phase.PENDING:
        return ""
    if start is None:
        return "est. start not within 30 days" if position else ""
    local = timezone.localtime(start)
    shown = f"{local:%H:%M}" if local.date() == timezone.localdate() else f"{local:%Y-%m-%d %H:%M}"
    # By deadlines the jobs ahead were assumed to run to their deadlines: the latest it starts, said so.
    latest = " at the latest" if (basis or "deadlines") == "deadlines" else ""
    return f"est. start {shown}{latest} (by {basis or 'deadlines'})"

