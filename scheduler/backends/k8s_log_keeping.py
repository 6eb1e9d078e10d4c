"""Which pod logs are copied into their archives, and when: a running replica's new lines now and then (on the
archiver's threads), an ended one's rest once (in the sync's thread), and what is left before a pod is deleted."""

from __future__ import annotations

import threading
from pathlib import Path

from django.conf import settings
from kubernetes import client

from scheduler.values import ReplicaObservation, ReplicaState

from .base import LogLayout
from .k8s_logs import LogArchiver
from .k8s_manifest import CONTAINER, pod_name


class PodLogKeeper:
    """The archives of the replicas' logs under ``root`` (``layout``), kept by a ``LogArchiver`` made on first use."""

    def __init__(self, *, core: client.CoreV1Api, namespace: str, root: Path, layout: LogLayout, workers: int,
                 refresh_seconds: float, requests_per_second: float | None = None):
        self.core = core
        self.namespace = namespace
        self.root = root
        self.layout = layout
        self.workers = workers
        self.refresh_seconds = refresh_seconds
        self.requests_per_second = (settings.JOBSITE_K8S_LOG_REQUESTS_PER_SECOND if requests_per_second is None
                                    else requests_per_second)
        self._lock = threading.Lock()
        self._archiver: LogArchiver | None = None
        self._final: set[str] = set()  # pods whose ended container's log is archived

    @property
    def archiver(self) -> LogArchiver:
        with self._lock:
            if self._archiver is None:
                self._archiver = LogArchiver(core=self.core, namespace=self.namespace, container=CONTAINER,
                                             workers=self.workers, refresh_seconds=self.refresh_seconds,
                                             requests_per_second=self.requests_per_second)
            return self._archiver

    def path(self, *, job_id: int, attempt_number: int, rank: int) -> Path:
        return self.layout(self.root, job_id, attempt_number, rank)

    def keep(self, *, job_id: int, attempt_number: int, rank: int, name: str, pod: dict,
             obs: ReplicaObservation) -> None:
        """A running replica's new lines are copied now and then (on the archiver's threads); an ended one's rest
        once (in the sync's thread, never admission's)."""
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        main = next((c for c in statuses if c.get("name") == CONTAINER), {})
        state = main.get("state") or {}
        started = "running" in state or "terminated" in state or bool(main.get("lastState"))
        if not started:
            return
        path = self.path(job_id=job_id, attempt_number=attempt_number, rank=rank)
        restarts = main.get("restartCount")
        if "terminated" in state and obs.state == ReplicaState.EXITED:
            with self._lock:
                if name in self._final:
                    return
            if self.archiver.finish(name, path, restarts=restarts):
                with self._lock:
                    self._final.add(name)
            return
        self.archiver.follow(name, path, restarts=restarts, prefer=rank == 0)

    def finish(self, *, job_id: int, attempt_number: int, rank: int) -> bool:
        """Copy what is left of a replica's log into its archive (before its pod goes). False if the API failed."""
        name = pod_name(job_id, attempt_number, rank)
        return self.archiver.finish(name, self.path(job_id=job_id, attempt_number=attempt_number, rank=rank))

    def forget(self, name: str) -> None:
        """Drop what is kept in memory about a pod that is gone (its archive stays)."""
        self.archiver.forget(name)
        with self._lock:
            self._final.discard(name)

    def keep_only(self, present: set[str]) -> None:
        """Forget the ended pods not in ``present`` (those that are gone)."""
        with self._lock:
            self._final &= present

    def close(self) -> None:
        """Stop the log copies (their threads end at once); a later use starts a new archiver."""
        with self._lock:
            archiver, self._archiver = self._archiver, None
        if archiver is not None:
            archiver.close(wait=True)
