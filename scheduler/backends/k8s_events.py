"""The Kubernetes Events of job pods, as job events: which are new, and recording them once.

An event is known by its uid (else its name) and count: a repeated event (``count`` grown) is recorded again with
"(xN)". The backend remembers what it recorded in memory; after a restart the job's event table answers instead.
"""

from __future__ import annotations

from typing import Any

from .k8s_informer import Informer

# (event key, rank, count, the event)
FreshEvent = tuple[tuple[str, int], int, int, dict[str, Any]]


def is_job_pod_event(ev: dict) -> bool:
    obj = ev.get("involvedObject") or {}
    return obj.get("kind") == "Pod" and str(obj.get("name", "")).startswith("job-")


def event_time(ev: dict) -> str:
    return str(ev.get("lastTimestamp") or ev.get("eventTime") or ev.get("firstTimestamp")
               or (ev.get("metadata") or {}).get("creationTimestamp") or "")


def event_key(ev: dict) -> tuple[str, int]:
    count = int(ev.get("count") or (ev.get("series") or {}).get("count") or 1)
    meta = ev.get("metadata") or {}
    return (meta.get("uid") or meta.get("name") or "", count)


def fresh_events(informer: Informer, names: list[str], seen: set[tuple[str, int]]) -> list[FreshEvent]:
    """The events of the pods ``names`` (in rank order) in the informer's cache that are not in ``seen``."""
    fresh = []
    for rank, name in enumerate(names):
        for ev in informer.indexed(name):
            key = event_key(ev)
            if key not in seen:
                fresh.append((key, rank, key[1], ev))
    return fresh


def events_record(*, job_id: int, attempt_number: int, replicas: int, fresh: list[FreshEvent]) -> bool:
    """Record the events as job events of the attempt, oldest first, each (reason, message) once.

    False when the attempt is not in the database (nothing recorded: try again later).
    """
    from django.db import transaction

    from jobs.models import Attempt, JobEvent
    from jobs.services import event_record

    attempt = Attempt.objects.select_related("job").filter(job_id=job_id, number=attempt_number).first()
    if attempt is None:
        return False
    with transaction.atomic():
        for _key, rank, count, ev in sorted(fresh, key=lambda item: event_time(item[3])):
            reason = str(ev.get("reason") or "Event")[:60]
            message = str(ev.get("message") or "").strip()
            if replicas > 1:
                message = f"replica {rank}: {message}"
            if count > 1:
                message += f" (x{count})"
            kind = "Warning" if ev.get("type") == "Warning" else "Normal"
            # The in-memory set is lost on restart; the table is not.
            if not JobEvent.objects.filter(job_id=job_id, attempt=attempt, reason=reason, message=message).exists():
                event_record(job=attempt.job, attempt=attempt, reason=reason, message=message, type=kind)
    return True
