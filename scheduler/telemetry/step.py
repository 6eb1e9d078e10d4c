"""The scheduler leader's telemetry step: every JOBSITE_GPU_SAMPLE_SECONDS, read the GPUs once, attribute the
readings to running attempts, store them and apply the idle-GPU rule. Bounded: at most MAX_ATTEMPTS attempts a round."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from jobs.choices import Phase
from jobs.models import Attempt
from jobs.services.telemetry import gpu_points_record, job_idle_update

from .attribute import RunningAttempt, attribute
from .dcgm import DcgmSampler
from .nvml import NvmlSampler

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 500
_state: dict[str, Any] = {"next": 0.0, "sampler": None, "key": None}


def sampler_for(backend_name: str) -> Any | None:
    """The DCGM exporter when JOBSITE_GPU_METRICS_URL is set, NVML on the local backend, else none."""
    if settings.JOBSITE_GPU_METRICS_URL:
        return DcgmSampler(settings.JOBSITE_GPU_METRICS_URL)
    if backend_name == "local":
        return NvmlSampler(node=settings.JOBSITE_LOCAL_NODE)
    return None


def telemetry_round(sampler: Any, *, interval: float, now=None) -> int:
    """One round with ``sampler``; how many attempts got readings."""
    now = now or timezone.now()
    running = Attempt.objects.filter(job__phase=Phase.RUNNING, job__current_attempt=F("pk"))
    attempts = list(running.select_related("job").order_by("pk")[:MAX_ATTEMPTS])
    if not attempts:
        return 0
    readings = sampler.read()
    owned = attribute(readings, [RunningAttempt(a.pk, a.job_id, a.number, a.placement) for a in attempts],
                      namespace=settings.JOBSITE_K8S_NAMESPACE)
    epoch = int(now.timestamp())
    for attempt in attempts:
        mine = owned.get(attempt.pk)
        if not mine:
            continue
        gpu_points_record(attempt=attempt, interval=interval,
                          readings=[(rank, r.node, r.gpu, r.point(epoch)) for rank, r in mine])
        job_idle_update(job=attempt.job, busiest=max(r.sm for _, r in mine), now=now)
    return len(owned)


def telemetry_tick(backend: Any) -> None:
    """Called by each sync round of the leader; samples when JOBSITE_GPU_SAMPLE_SECONDS have passed."""
    interval = settings.JOBSITE_GPU_SAMPLE_SECONDS
    if not interval or time.monotonic() < _state["next"]:
        return
    _state["next"] = time.monotonic() + interval
    key = (backend.name, settings.JOBSITE_GPU_METRICS_URL)
    if _state["key"] != key:
        _state["key"], _state["sampler"] = key, sampler_for(backend.name)
    if _state["sampler"] is None:
        return
    try:
        telemetry_round(_state["sampler"], interval=interval)
    except (OSError, ValueError) as exc:  # an unreachable exporter or a garbled scrape: the next round tries again
        log.warning("GPU telemetry: cannot read %s (%s)", _state["sampler"].source, exc)
