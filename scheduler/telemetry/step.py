"""The scheduler leader's telemetry step: every JOBSITE_GPU_SAMPLE_SECONDS, read the GPUs once (in a thread of its
own, with its own timeout: the sync round never waits on an exporter), and at the next sync round attribute the
readings to running attempts, store them and apply the idle-GPU rule. Bounded: one read under way at a time, at most
MAX_ATTEMPTS attempts a round."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import F, QuerySet
from django.utils import timezone

from jobs.choices import Phase
from jobs.models import Attempt
from jobs.services.telemetry import gpu_points_record, gpu_series_compact, gpus_changed_publish, job_idle_update

from .attribute import RunningAttempt, attribute
from .dcgm import DcgmSampler
from .nvml import NvmlSampler
from .samples import GpuReading

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 500
SCRAPE_TIMEOUT = 5.0  # seconds one read of the GPUs may take, in its own thread
COMPACT_SECONDS = 60.0  # how often the passed rows of ended attempts are folded (``gpu_series_compact``)


def fresh_state() -> dict[str, Any]:
    """The sampling clock before any round: when to read next and to fold next, the reader and what it reads."""
    return {"next": 0.0, "next_compact": 0.0, "scrapes": None, "key": None}


_state: dict[str, Any] = fresh_state()


def sampler_for(backend_name: str) -> Any | None:
    """The DCGM exporter when JOBSITE_GPU_METRICS_URL is set, NVML on the local backend, else none."""
    if settings.JOBSITE_GPU_METRICS_URL:
        return DcgmSampler(settings.JOBSITE_GPU_METRICS_URL, timeout=SCRAPE_TIMEOUT)
    if backend_name == "local":
        return NvmlSampler(node=settings.JOBSITE_LOCAL_NODE)
    return None


class Scrapes:
    """A sampler's reads, off the sync round: ``start`` begins one in a thread of its own (unless one is still under
    way: a hanging exporter holds one thread, never more, until its timeout), ``take`` hands over the last one
    completed (once). The round that stores it never waits on the network."""

    def __init__(self, sampler: Any):
        self.sampler = sampler
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.done: tuple[datetime, list[GpuReading]] | None = None

    def start(self) -> bool:
        with self.lock:
            if self.thread is not None and self.thread.is_alive():
                return False
            self.thread = threading.Thread(target=self._read, name="jobsite-gpu-sampler", daemon=True)
            self.thread.start()
            return True

    def _read(self) -> None:
        try:
            readings = self.sampler.read()
        except (OSError, ValueError) as exc:  # an unreachable exporter or a garbled scrape: the next round tries again
            log.warning("GPU telemetry: cannot read %s (%s)", self.sampler.source, exc)
            return
        except Exception:
            log.exception("GPU telemetry: reading %s failed", self.sampler.source)
            return
        with self.lock:
            self.done = (timezone.now(), readings)

    def take(self) -> tuple[datetime, list[GpuReading]] | None:
        with self.lock:
            done, self.done = self.done, None
            return done


def _running() -> QuerySet[Attempt]:
    return Attempt.objects.filter(job__phase=Phase.RUNNING, job__current_attempt=F("pk"))


def telemetry_store(readings: list[GpuReading], *, interval: float, now: datetime) -> int:
    """Store one read of the GPUs (taken at ``now``) for the running attempts they belong to; how many attempts got
    readings. The job detail pages of those are told after commit (one message for the round)."""
    attempts = list(_running().select_related("job").order_by("pk")[:MAX_ATTEMPTS])
    if not attempts:
        return 0
    owned = attribute(readings, [RunningAttempt(a.pk, a.job_id, a.number, a.placement) for a in attempts],
                      namespace=settings.JOBSITE_K8S_NAMESPACE)
    epoch = int(now.timestamp())
    changed = []
    for attempt in attempts:
        mine = owned.get(attempt.pk)
        if not mine:
            continue
        gpu_points_record(attempt=attempt, interval=interval,
                          readings=[(rank, r.node, r.gpu, r.point(epoch)) for rank, r in mine])
        job_idle_update(job=attempt.job, busiest=max(r.sm for _, r in mine), now=now)
        changed.append(attempt.job_id)
    gpus_changed_publish(changed)
    return len(owned)


def telemetry_round(sampler: Any, *, interval: float, now: datetime | None = None) -> int:
    """One round with ``sampler``, read and stored in the caller's thread (tests, scripts); how many attempts got
    readings."""
    if not _running().exists():
        return 0
    return telemetry_store(sampler.read(), interval=interval, now=now or timezone.now())


def telemetry_tick(backend: Any) -> None:
    """Called by each sync round of the leader (only the leader samples): stores the read completed since the last
    round, if any, and every JOBSITE_GPU_SAMPLE_SECONDS, while attempts run, starts the next read in its thread."""
    interval = settings.JOBSITE_GPU_SAMPLE_SECONDS
    if not interval:
        return
    key = (backend.name, settings.JOBSITE_GPU_METRICS_URL)
    if _state["key"] != key:
        sampler = sampler_for(backend.name)
        _state["key"], _state["scrapes"], _state["next"] = key, sampler and Scrapes(sampler), 0.0
    scrapes: Scrapes | None = _state["scrapes"]
    if scrapes is None:
        return
    done = scrapes.take()
    # A read left from before a pause in leading is stale: dropped, not stored as if it were now.
    if done is not None and (timezone.now() - done[0]).total_seconds() <= max(3 * interval, 30.0):
        telemetry_store(done[1], interval=interval, now=done[0])
    if time.monotonic() >= _state["next_compact"]:  # the series of ended attempts, once a minute
        _state["next_compact"] = time.monotonic() + COMPACT_SECONDS
        gpu_series_compact(now=timezone.now().timestamp())
    if time.monotonic() >= _state["next"] and _running().exists():
        _state["next"] = time.monotonic() + interval
        scrapes.start()
