"""Prometheus metrics of the scheduler, in prometheus_client's default REGISTRY.

Observed directly by the loop, the passes and the backends:

- ``PASS_SECONDS`` / ``SYNC_SECONDS``: ``with metrics.PASS_SECONDS.time(): ...``
- ``ROUNDS_RETRIED`` / ``ROUNDS_FAILED``: rounds (admission, sync) run again on a fresh database connection, and
  rounds that failed all the same (``scheduler.loop``),
- ``observe_admission(queued_at, admitted_at)``: queued → admitted latency of one job,
- ``api_call(verb)`` / ``api_error(verb, code)``: calls to, and failures of, the cluster API.

Read at scrape time, from sources registered here (weakly where they are objects, so a backend that is replaced
goes away; a source that is gone, raises or returns nothing is skipped):

- ``register_informer(informer)``: ``jobsite_informer_*{resource}`` from its ``name``, ``relists``, ``errors``,
  ``expired``, ``watches``, ``resyncs`` and ``lag_seconds()``;
- ``register_pods_source(fn)``: ``jobsite_pods{phase}`` and ``jobsite_pods_terminating`` from ``fn()``, an iterable
  of pod dicts as the API returns them (``None`` for "don't know now");
- ``scheduler.health``: ``jobsite_scheduler_leader`` and ``jobsite_scheduler_seconds_since_beat``, only in a process
  whose loop has called ``health.started()``.
"""

from __future__ import annotations

import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone
from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import health

log = logging.getLogger(__name__)

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ADMISSION_BUCKETS = (  # 10 ms to 1 h
    0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
)

PASS_SECONDS = Histogram(
    "jobsite_scheduler_pass_seconds", "Duration of one scheduling pass.", buckets=_DURATION_BUCKETS
)
SYNC_SECONDS = Histogram(
    "jobsite_scheduler_sync_seconds", "Duration of one sync round with the backend.", buckets=_DURATION_BUCKETS
)
ROUNDS_RETRIED = Counter(
    "jobsite_scheduler_rounds_retried_total",
    "Rounds run again at once on a fresh database connection after theirs failed, by round (admission, sync).",
    ["round"],
)
ROUNDS_FAILED = Counter(
    "jobsite_scheduler_rounds_failed_total", "Rounds that failed (after their retries), by round.", ["round"]
)
ADMISSION_LATENCY = Histogram(
    "jobsite_admission_latency_seconds", "Time from queued to admitted, per admitted job.", buckets=_ADMISSION_BUCKETS
)
K8S_API_ERRORS = Counter(
    "jobsite_k8s_api_errors_total", "Failed Kubernetes API calls, by verb and HTTP status (or 'network').",
    ["verb", "code"],
)
CLUSTER_API_CALLS = Counter("jobsite_cluster_api_calls_total", "Calls to the cluster API, by verb.", ["verb"])
SOURCE_ERRORS = Counter(
    "jobsite_metrics_source_errors_total", "Scrape-time metric sources that raised, by kind.", ["source"]
)

POD_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
_INFORMER_COUNTERS = (
    ("relists", "jobsite_informer_relists", "Full lists done by the informer."),
    ("errors", "jobsite_informer_errors", "List or watch errors of the informer."),
    ("expired", "jobsite_informer_expired", "Watches that ended in 410 Gone (resourceVersion too old)."),
    ("watches", "jobsite_informer_watches", "Watch requests started by the informer."),
    ("resyncs", "jobsite_informer_resyncs", "Periodic resyncs of the informer."),
)


# --- direct observations -------------------------------------------------------------------------------------


def observe_admission(queued_at: datetime | None, admitted_at: datetime | None = None) -> None:
    """One job admitted: observes admitted_at (default now) − queued_at; nothing when queued_at is unknown."""
    if queued_at is None:
        return
    admitted_at = admitted_at or timezone.now()
    ADMISSION_LATENCY.observe(max(0.0, (admitted_at - queued_at).total_seconds()))


def api_call(verb: str) -> None:
    CLUSTER_API_CALLS.labels(verb=verb).inc()


def api_error(verb: str, code: int | str | None) -> None:
    """A failed API call: ``code`` is the HTTP status; None, 0 or "" count as "network"."""
    K8S_API_ERRORS.labels(verb=verb, code=str(code) if code else "network").inc()


def api_error_code(exc: BaseException) -> str:
    """The ``code`` label for an exception: the status of an ApiException, else "network"."""
    status = getattr(exc, "status", None)
    return str(status) if isinstance(status, int) and status else "network"


# --- scrape-time sources -------------------------------------------------------------------------------------

_lock = threading.Lock()
_informers: list[weakref.ref] = []
_pods_source: Callable[[], Callable[[], Iterable[dict] | None] | None] | None = None


def register_informer(informer: Any) -> None:
    """Report ``informer`` (held weakly). Of live informers with the same name, the latest registered is reported."""
    with _lock:
        _informers[:] = [r for r in _informers if r() is not None and r() is not informer]
        _informers.append(weakref.ref(informer))


def register_pods_source(fn: Callable[[], Iterable[dict] | None] | None) -> None:
    """The one source of ``jobsite_pods`` (replaces the previous one; None removes it). A bound method is held
    weakly (its object may go away); a plain function is held strongly."""
    global _pods_source
    if fn is None:
        ref = None
    elif inspect.ismethod(fn):
        ref = weakref.WeakMethod(fn)
    else:
        ref = lambda: fn  # noqa: E731
    with _lock:
        _pods_source = ref


def _live_informers() -> dict[str, Any]:
    with _lock:
        refs = list(_informers)
    by_name: dict[str, Any] = {}
    for ref in refs:
        informer = ref()
        if informer is None:
            continue
        try:
            by_name[str(informer.name)] = informer
        except Exception:
            SOURCE_ERRORS.labels(source="informer").inc()
    return by_name


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class SchedulerCollector(Collector):
    """Informers, pods and the loop's health, read when scraped."""

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        for part in (self._collect_health, self._collect_informers, self._collect_pods):
            try:
                part(families)
            except Exception:
                log.exception("metrics: %s failed", part.__name__)
        return [f for f in families.values() if f.samples]

    @staticmethod
    def _families() -> dict[str, Metric]:
        families: dict[str, Metric] = {
            "leader": GaugeMetricFamily("jobsite_scheduler_leader", "1 while this scheduler holds the leader lease, "
                                        "0 on a standby."),
            "beat": GaugeMetricFamily("jobsite_scheduler_seconds_since_beat",
                                      "Seconds since the scheduler loop last finished a round."),
            "lag": GaugeMetricFamily("jobsite_informer_lag_seconds", "How far behind the API server the informer's "
                                     "cache may be.", labels=["resource"]),
            "synced": GaugeMetricFamily("jobsite_informer_synced", "1 once the informer has listed.",
                                        labels=["resource"]),
            "pods": GaugeMetricFamily("jobsite_pods", "Managed pods by phase.", labels=["phase"]),
            "terminating": GaugeMetricFamily("jobsite_pods_terminating", "Managed pods being deleted."),
        }
        for attr, name, doc in _INFORMER_COUNTERS:
            families[attr] = CounterMetricFamily(name, doc, labels=["resource"])
        return families

    @staticmethod
    def _collect_health(families: dict[str, Metric]) -> None:
        if health.seconds_since_start() is None:
            return  # no scheduler loop in this process (a web worker)
        families["leader"].add_metric([], 1.0 if health.is_leader() else 0.0)
        age = health.seconds_since_beat()
        if age is not None:
            families["beat"].add_metric([], age)

    @staticmethod
    def _collect_informers(families: dict[str, Metric]) -> None:
        for name, informer in sorted(_live_informers().items()):
            try:
                for attr, _, _ in _INFORMER_COUNTERS:
                    value = _number(getattr(informer, attr, None))
                    if value is not None:
                        families[attr].add_metric([name], value)
                lag_seconds = getattr(informer, "lag_seconds", None)
                lag = _number(lag_seconds()) if callable(lag_seconds) else None
                if lag is not None:
                    families["lag"].add_metric([name], lag)
                synced = getattr(informer, "synced", None)
                if synced is not None and callable(getattr(synced, "is_set", None)):
                    families["synced"].add_metric([name], 1.0 if synced.is_set() else 0.0)
            except Exception:
                log.warning("metrics: informer %s could not be read", name, exc_info=True)
                SOURCE_ERRORS.labels(source="informer").inc()

    @staticmethod
    def _collect_pods(families: dict[str, Metric]) -> None:
        with _lock:
            ref = _pods_source
        fn = ref() if ref is not None else None
        if fn is None:
            return
        try:
            counts, terminating = _count_pods(fn())
        except Exception:
            log.warning("metrics: the pods source failed", exc_info=True)
            SOURCE_ERRORS.labels(source="pods").inc()
            return
        if counts is None:
            return
        for phase in POD_PHASES:
            families["pods"].add_metric([phase], counts[phase])
        families["terminating"].add_metric([], terminating)


def _count_pods(pods: Iterable[dict] | None) -> tuple[dict[str, int] | None, int]:
    if pods is None:
        return None, 0
    counts = dict.fromkeys(POD_PHASES, 0)
    terminating = 0
    for pod in pods:
        if not isinstance(pod, dict):
            continue
        phase = (pod.get("status") or {}).get("phase")
        counts[phase if phase in counts else "Unknown"] += 1
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            terminating += 1
    return counts, terminating


COLLECTOR = SchedulerCollector()
REGISTRY.register(COLLECTOR)

