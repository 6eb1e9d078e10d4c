"""The events of a job's trail: ``event_record`` appends one and has open detail pages hear of it after commit."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from ..choices import EventType
from ..models import Attempt, Job, JobEvent
from ..prepared_writes import insert


def event_record(
    *, job: Job, reason: str, message: str = "", type: str = EventType.NORMAL, attempt: Attempt | None = None,
    publish: bool = True, at: datetime | None = None,
) -> JobEvent:
    """Append an event to a job's trail; open detail pages get it after commit (``job_transition`` publishes
    its own change, so it passes ``publish=False``). ``at``: when it happened, when that was before now (a replica
    seen running started a moment ago)."""
    event = insert(JobEvent(job=job, attempt=attempt or job.current_attempt, type=type, reason=reason,
                            message=message))
    if at is not None and at < event.time:
        JobEvent.objects.filter(pk=event.pk).update(time=at)
        event.time = at
    if publish:
        from ..live_publisher import publish_job_changes

        transaction.on_commit(lambda: publish_job_changes([job.pk]), robust=True)
    return event
