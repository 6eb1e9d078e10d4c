"""The Kubernetes Events of job pods, as plain values: which are new since the scheduler last recorded them.

An event is known by its uid (else its name) and count: a repeated event (``count`` grown) comes again. The backend
remembers in memory what the scheduler recorded; after a restart the job's event table answers instead.
"""

from __future__ import annotations

from .base import BackendEvent
from .k8s_informer import Informer


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


def fresh_events(informer: Informer, names: list[str], seen: set[tuple[str, int]]) -> list[BackendEvent]:
    """The events of the pods ``names`` (in rank order) in the informer's cache that are not in ``seen``."""
    fresh = []
    for rank, name in enumerate(names):
        for ev in informer.indexed(name):
            key = event_key(ev)
            if key not in seen:
                fresh.append(BackendEvent(
                    key=key, rank=rank, count=key[1], reason=str(ev.get("reason") or "Event"),
                    message=str(ev.get("message") or ""), type="Warning" if ev.get("type") == "Warning" else "Normal",
                    at=event_time(ev),
                ))
    return fresh
