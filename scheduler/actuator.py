"""The scheduler's hands: the backend calls (launch, stop, relaunch, TTL cleanup) that decisions lead to.

They run after the decision has committed and, in the scheduler loop, on a small pool of worker threads, so a slow
or failing cluster API (retries, ``Retry-After``, timeouts) never holds up admission. Without a pool (``workers=0``:
tests, one-shot commands) they run inline in the caller's thread. At most one call per attempt and kind is queued at
a time, and the stops that went through are remembered, so reconcile asks for a graceful stop once.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.db import connections

from .backends.base import Backend
from .launch import attempt_launch, attempt_relaunch

log = logging.getLogger(__name__)


class Actuator:
    def __init__(self, backend: Backend, workers: int = 0):
        self.backend = backend
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="jobsite-actuator") if workers else None
        self._lock = threading.Lock()
        self._queued: set[tuple[str, int]] = set()
        self._stops: dict[int, str] = {}  # attempt id -> "graceful" | "forced", for stops that went through

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
        self._run(("launch", job_id), lambda: attempt_launch(job_id, backend=self.backend))

    def relaunch(self, job_id: int) -> None:
        self._run(("relaunch", job_id), lambda: attempt_relaunch(job_id, backend=self.backend))

    def stop(self, *, attempt_id: int, job_id: int, attempt_number: int, replicas: int, force: bool) -> None:
        def call() -> None:
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
            fn()
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
    return actuator
