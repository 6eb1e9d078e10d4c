"""The scheduler's hands: the backend calls (launch, stop, relaunch, TTL cleanup) that decisions lead to.

They run after the decision has committed and, in the scheduler loop, on a small pool of worker threads, so a slow
or failing cluster API (retries, ``Retry-After``, timeouts) never holds up admission. Without a pool (``workers=0``:
tests, one-shot commands) they run inline in the caller's thread. At most one call per attempt and kind is queued at
a time, and the stops that went through are remembered, so reconcile asks for a graceful stop once.

A launch the backend's API cut short (``BackendUnavailable``: its retries ran out) is remembered too, and tried
again, once per sync round, before the attempt is observed (``resume_launch``) until it is made, refused or
stopped.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.db import connections

from .backends.base import Backend, BackendUnavailable, LaunchError
from .launch import attempt_launch, attempt_relaunch
from .leader import FENCE, Deposed
from .values import LaunchSpec, ReplicaObservation, ReplicaState

log = logging.getLogger(__name__)


class Actuator:
    def __init__(self, backend: Backend, workers: int = 0):
        self.backend = backend
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="jobsite-actuator") if workers else None
        self._lock = threading.Lock()
        self._queued: set[tuple[str, int]] = set()
        self._stops: dict[int, str] = {}  # attempt id -> "graceful" | "forced", for stops that went through
        self._unlaunched: dict[tuple[int, int], LaunchSpec] = {}  # (job, attempt number): launches cut short

    # --- what reconcile reads ----------------------------------------------------------------------------------

    def stop_sent(self, attempt_id: int) -> str:
        with self._lock:
            return self._stops.get(attempt_id, "")

    def in_flight(self, kind: str, key: int) -> bool:
        """Whether a call (``kind`` "launch", "stop", ... of job or attempt ``key``) is queued or running here."""
        with self._lock:
            return (kind, key) in self._queued

    def forget(self, live_attempt_ids: set[int]) -> None:
        """Drop what is remembered of attempts that no longer hold resources."""
        with self._lock:
            for attempt_id in list(self._stops):
                if attempt_id not in live_attempt_ids:
                    del self._stops[attempt_id]

    # --- calls -----------------------------------------------------------------------------------------------------

    def launch(self, job_id: int) -> None:
        self._run(("launch", job_id), lambda: attempt_launch(job_id, backend=self.backend, launch=self._launch))

    def relaunch(self, job_id: int) -> None:
        self._run(("relaunch", job_id), lambda: attempt_relaunch(job_id, backend=self.backend, launch=self._launch))

    def _launch(self, spec: LaunchSpec, *, retries: int | None = None) -> dict:
        """The backend's launch; one cut short by an unavailable API is remembered for ``resume_launch``."""
        key = (spec.job_id, spec.attempt_number)
        try:
            data = self.backend.launch(spec) if retries is None else self.backend.launch(spec, retries=retries)
        except LaunchError:
            self._unlaunched_pop(key)
            raise
        except BackendUnavailable:
            with self._lock:
                self._unlaunched[key] = spec
            raise
        self._unlaunched_pop(key)
        return data

    def _unlaunched_pop(self, key: tuple[int, int]) -> None:
        with self._lock:
            self._unlaunched.pop(key, None)

    def resume_launch(self, *, job_id: int, attempt_number: int, replicas: int) -> list[ReplicaObservation] | None:
        """Try a launch cut short once more (no retries: the sync round goes on). What to take its replicas for
        when it failed again (refused: they failed; the API still out: they are starting); None when nothing was
        pending or it went through (observe the backend)."""
        with self._lock:
            pending = self._unlaunched.get((job_id, attempt_number))
        if pending is None:
            return None
        try:
            self._launch(pending, retries=0)
        except LaunchError as exc:
            return [ReplicaObservation(r, ReplicaState.FAILED, reason="ContainerCannotRun", message=str(exc))
                    for r in range(replicas)]
        except BackendUnavailable as exc:
            return [ReplicaObservation(r, ReplicaState.STARTING, status="Pending",
                                       message=f"waiting for the Kubernetes API to create the pods: {exc}")
                    for r in range(replicas)]
        return None

    def stop(self, *, attempt_id: int, job_id: int, attempt_number: int, replicas: int, force: bool) -> None:
        def call() -> None:
            self._unlaunched_pop((job_id, attempt_number))
            self.backend.stop(job_id=job_id, attempt_number=attempt_number, replicas=replicas, force=force)
            with self._lock:
                self._stops[attempt_id] = "forced" if force else "graceful"

        self._run(("stop-forced" if force else "stop", attempt_id), call)

    def cleanup(self, job_id: int, attempts: list[tuple[int, int]], done: Callable[[], None]) -> None:
        """Delete what the attempts ``(number, replicas)`` of an ended job left behind, then call ``done``."""
        def call() -> None:
            for number, replicas in attempts:
                self.backend.cleanup(job_id=job_id, attempt_number=number, replicas=replicas)
            done()

        self._run(("cleanup", job_id), call)

    def _run(self, key: tuple[str, int], fn: Callable[[], None]) -> None:
        with self._lock:
            if key in self._queued:
                return
            self._queued.add(key)
        if self._pool is None:
            self._call(key, fn)
            return
        self._pool.submit(self._in_thread, key, fn)

    def _in_thread(self, key: tuple[str, int], fn: Callable[[], None]) -> None:
        try:
            self._call(key, fn)
        finally:
            # A pool thread's connection is not left behind when the pool goes (cluster calls dwarf reconnecting).
            connections.close_all()

    def _call(self, key: tuple[str, int], fn: Callable[[], None]) -> None:
        try:
            FENCE.check(f"{key[0]} {key[1]}")  # queued while leader, run after being deposed: refused
            fn()  # (the backend checks the fence again right before each create and delete)
        except Deposed as exc:  # the new leader decides
            log.warning("%s", exc)
        except Exception:  # the next sync round decides again
            log.exception("%s of %s failed", *key)
        finally:
            with self._lock:
                self._queued.discard(key)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


_actuators: weakref.WeakKeyDictionary[Backend, Actuator] = weakref.WeakKeyDictionary()
_actuators_lock = threading.Lock()


def get_actuator(backend: Backend) -> Actuator:
    """The actuator of ``backend`` in this process (inline unless the scheduler loop installed a pool)."""
    with _actuators_lock:
        actuator = _actuators.get(backend)
        if actuator is None:
            actuator = _actuators[backend] = Actuator(backend)
        return actuator


def install_actuator(backend: Backend, workers: int) -> Actuator:
    with _actuators_lock:
        old = _actuators.get(backend)
        actuator = _actuators[backend] = Actuator(backend, workers)
    if old is not None:
        actuator._stops.update(old._stops)
        actuator._unlaunched.update(old._unlaunched)
    return actuator
