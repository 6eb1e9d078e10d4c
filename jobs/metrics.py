"""The web app's /metrics: the process's default prometheus REGISTRY plus gauges computed from the database.

The database gauges are computed at each scrape with a few aggregate queries (``job_figures``) and never registered
in the default REGISTRY, so a scheduler process serving that registry does not report them too. A scrape needs
``Authorization: Bearer <JOBSITE_METRICS_TOKEN>`` or a staff session, except in the embedded default with no token
or when JOBSITE_METRICS_PUBLIC opens it (``jobsite.security.metrics_refusal``).

With several web processes (``jobsite.serve_web``: ``PROMETHEUS_MULTIPROC_DIR`` set) a scrape reaches one of them, so
it reports what all of them counted: prometheus_client's ``MultiProcessCollector`` adds up the files every process
writes there (counters and histograms summed, gauges as their ``multiprocess_mode`` says), instead of this
process's REGISTRY; gauges of processes that are gone are forgotten first (``forget_dead_processes``).

This module must not import the scheduler: the web app's metrics of the scheduler come only through the REGISTRY.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from django.db import DatabaseError
from django.db.models import Count, Min
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import REGISTRY, CollectorRegistry, multiprocess
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from jobsite.security import metrics_refusal

from .choices import QUEUED_PHASES, RESOURCE_PHASES, Phase
from .models import Group, Job
from .selectors import held_resources

log = logging.getLogger(__name__)


@dataclass
class GroupQueue:
    length: int = 0
    oldest_queued_at: datetime | None = None


@dataclass
class JobFigures:
    now: datetime
    jobs_by_phase: dict[str, int]  # every phase, 0 when none
    queues: dict[str, GroupQueue]  # every group, by name
    gpus_held: dict[str, int] = field(default_factory=dict)  # every group, by name

    def oldest_wait_seconds(self, group: str) -> float:
        oldest = self.queues[group].oldest_queued_at
        return 0.0 if oldest is None else max(0.0, (self.now - oldest).total_seconds())


def job_figures(now: datetime | None = None) -> JobFigures:
    """Jobs per phase, and per group the queue (QUEUED_PHASES) and the GPUs held (RESOURCE_PHASES): four
    aggregate queries, none of them reading rows one by one."""
    now = now or timezone.now()
    jobs_by_phase = dict.fromkeys(Phase.values, 0)
    for phase, count in Job.objects.order_by().values_list("phase").annotate(n=Count("id")):
        jobs_by_phase[phase] = count
    groups = list(Group.objects.order_by("name").values_list("name", flat=True))
    queues = {name: GroupQueue() for name in groups}
    queued = (
        Job.objects.filter(phase__in=sorted(QUEUED_PHASES))
        .order_by()
        .values_list("group__name")
        .annotate(n=Count("id"), oldest=Min("queued_at"))
    )
    for name, count, oldest in queued:
        queues[name] = GroupQueue(count, oldest)
    gpus_held = dict.fromkeys(groups, 0)
    held = (
        Job.objects.filter(phase__in=sorted(RESOURCE_PHASES))
        .order_by()
        .values_list("group__name")
        .annotate(gpu=held_resources()["gpu"])
    )
    for name, gpu in held:
        gpus_held[name] = gpu or 0
    return JobFigures(now=now, jobs_by_phase=jobs_by_phase, queues=queues, gpus_held=gpus_held)


class DatabaseCollector:
    """The database gauges, for one scrape."""

    def __init__(self, now: datetime | None = None):
        self.now = now

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("jobsite_database_up", "1 when the metrics' database queries succeeded.")
        try:
            figures = job_figures(self.now)
        except DatabaseError:
            log.exception("metrics: the database queries failed")
            up.add_metric([], 0.0)
            return [up]
        up.add_metric([], 1.0)
        jobs = GaugeMetricFamily("jobsite_jobs", "Jobs by phase.", labels=["phase"])
        for phase, count in figures.jobs_by_phase.items():
            jobs.add_metric([phase], count)
        length = GaugeMetricFamily("jobsite_queue_length", "Queued jobs (submitted, pending or inadmissible) by "
                                   "group.", labels=["group"])
        wait = GaugeMetricFamily("jobsite_queue_oldest_wait_seconds", "Seconds the longest-queued job of the group "
                                 "has waited (since it was queued), 0 when its queue is empty.", labels=["group"])
        for name, queue in figures.queues.items():
            length.add_metric([name], queue.length)
            wait.add_metric([name], figures.oldest_wait_seconds(name))
        gpus = GaugeMetricFamily("jobsite_gpus_held", "GPUs held (requested × replicas) by the group's admitted "
                                 "jobs.", labels=["group"])
        for name, count in figures.gpus_held.items():
            gpus.add_metric([name], count)
        return [up, jobs, length, wait, gpus]


class _Scrape:
    """What one scrape reports: the default REGISTRY, then the database gauges."""

    def __init__(self, *collectors):
        self.collectors = collectors

    def collect(self) -> Iterable[Metric]:
        for collector in self.collectors:
            yield from collector.collect()


def forget_dead_processes(path: str) -> None:
    """Drop the live gauges (``livesum``, ``liveall``, …) of processes that have ended (a worker restarted)."""
    pids = {int(m.group(1)) for f in Path(path).glob("gauge_live*_*.db") if (m := re.search(r"_(\d+)\.db$", f.name))}
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(pid, path)
        except PermissionError:
            pass  # alive, someone else's


def process_metrics() -> object:
    """What the processes of the web server counted: this one's REGISTRY, or all of them in multiprocess mode."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return REGISTRY
    forget_dead_processes(path)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)
    return registry


def _forbidden(request: HttpRequest) -> HttpResponse | None:
    """None when the request may scrape; else the 401 or 403 to answer (``jobsite.security.metrics_refusal``)."""
    user = getattr(request, "user", None)
    authenticated = bool(user is not None and user.is_authenticated)
    refusal = metrics_refusal(request.headers.get("Authorization", ""), authenticated=authenticated,
                              staff=authenticated and user.is_staff)
    if refusal is None:
        return None
    status, text = refusal
    response = HttpResponse(text, status=status, content_type="text/plain")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    denied = _forbidden(request)
    if denied is not None:
        return denied
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(_Scrape(process_metrics(), DatabaseCollector())), content_type=content_type)
