"""Recording what a backend saw happen to an attempt's replicas (its Kubernetes Events) as job events, each once."""

from __future__ import annotations

from django.db import transaction

from jobs.models import Attempt, JobEvent
from jobs.services import event_record

from .backends.base import BackendEvent


def backend_events_record(*, job_id: int, attempt_number: int, replicas: int, events: list[BackendEvent]) -> bool:
    """Record the events as job events of the attempt, oldest first, each (reason, message) once.

    False when the attempt is not in the database (nothing recorded: try again later).
    """
    attempt = Attempt.objects.select_related("job").filter(job_id=job_id, number=attempt_number).first()
    if attempt is None:
        return False
    with transaction.atomic():
        # The backend's in-memory set is lost on restart; the table is not: what the attempt has, read once.
        recorded = set(JobEvent.objects.filter(job_id=job_id, attempt=attempt).values_list("reason", "message"))
        for ev in sorted(events, key=lambda e: e.at):
            reason = ev.reason[:60]
            message = ev.message.strip()
            if replicas > 1:
                message = f"replica {ev.rank}: {message}"
            if ev.count > 1:
                message += f" (x{ev.count})"
            if (reason, message) not in recorded:
                event_record(job=attempt.job, attempt=attempt, reason=reason, message=message, type=ev.type)
                recorded.add((reason, message))
    return True
