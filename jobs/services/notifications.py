"""Notifications of job events: subscriptions, and the outbox rows a transition makes for them."""

from __future__ import annotations

from ..models import Job, JobEvent


def notifications_on_transition(*, job: Job, old_phase: str, event: JobEvent) -> None:
    """``job`` has just changed phase (inside its transition's transaction, ``event`` its trail's entry): queue a
    notification for each subscription that asked for this kind of change."""
