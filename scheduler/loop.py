"""The scheduler of a process: one leader among the scheduler processes runs admission, sync and housekeeping.

Threads (all daemons):
- the elector renews or tries to take the leadership every JOBSITE_LEADER_RETRY_SECONDS (``scheduler.leader``);
  on winning it starts the backend's watches (a fresh list), on losing it stops them and stops acting;
- admission: a scheduling pass every interval or when woken (database only; launches go to the actuator);
- sync: reads every active attempt back from the backend and applies what ``reconcile`` decides, runs the clocks
  (backoff, TTL) once an interval and, now and then, deletes orphaned pods; its backend calls also go to the
  actuator;
- exits (backends that report exits: local): while leading, waits on the backend's socket and starts a sync as
  soon as a replica reports its exit, so a finished job frees its GPUs at once, not at the next interval;
- a round whose database connection failed (the server ended it: a restart, a failover, pg_terminate_backend)
  runs again at once on a fresh one (the pool checks each connection before handing it out); a round works from
  what the database says now, so running it again is safe;
- admission rests after each pass as long as it took (a burst of wake-ups shares one pass, and passes never hold
  the process, whose GIL the embedded default shares with the web server, more than half the time);
- the actuator's pool: launches, stops, relaunches and TTL cleanups, so the cluster API never holds up admission;
- with a separate scheduler process on PostgreSQL, a listener turns the web's ``NOTIFY`` into wake-ups.

The embedded default runs it as threads of the web process (``manage.py serve``); ``manage.py runscheduler`` runs it
in the foreground, with /healthz, /readyz and /metrics on JOBSITE_SCHEDULER_HTTP_PORT.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connections

from jobs.wakeup import ADMISSION_ONLY, CHANNEL, sync_requested, wake_here, wakeup_event

from . import health, metrics
from .actuator import get_actuator, install_actuator
from .backend_factory import get_backend
from .leader import Elector, dedicated_connection, elector_from_settings
from .passes import schedule_pass
from .sync import housekeeping, orphans_delete, sync_jobs
from .telemetry.step import telemetry_tick

log = logging.getLogger(__name__)

ACTUATOR_WORKERS = 4
# A round whose database connection fails is run again at once on a fresh one, up to this many times in all: after
# PostgreSQL ends every connection, the first tries may still meet connections it ended (jobsite.dbpool sweeps them).
ROUND_TRIES = 3


def tick() -> None:
    """One round of everything, in the caller's thread (for scripts and tests)."""
    backend = get_backend()
    schedule_pass(backend=backend)
    sync_jobs(backend=backend)
    housekeeping(backend=backend)


class SchedulerLoop:
    def __init__(self, interval: float | None = None, elector: Elector | None = None):
        self.interval = interval or settings.JOBSITE_SCHEDULER_INTERVAL
        self.elector = elector or elector_from_settings()
        self.backend = get_backend()
        self.stopping = threading.Event()
        self.leading = threading.Event()
        self._wake_admission = threading.Event()
        self._wake_sync = threading.Event()
        self._threads: list[threading.Thread] = []
        self._next_orphan_check = 0.0
        self._next_housekeeping = 0.0
        self._listener: Any = None  # the bound exit socket, owned by the exits thread
        self._leadership_changed = threading.Event()

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        health.started()
        log.info("scheduler %s starting (backend %s, every %.1f s)", self.elector.identity, self.backend.name,
                 self.interval)
        targets: list[tuple[str, Callable[[], None]]] = [
            ("elector", self._elect), ("admission", self._admission), ("sync", self._sync), ("wakeup", self._fan_out),
        ]
        if settings.JOBSITE_SCHEDULER_MODE == "process" and connections["default"].vendor == "postgresql":
            targets.append(("listen", self._listen))
        if self.backend.reports_exits:
            targets.append(("exits", self._exits))
        for name, target in targets:
            thread = threading.Thread(target=target, name=f"jobsite-scheduler-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self.stopping.set()
        wakeup_event().set()
        self._wake_admission.set()
        self._wake_sync.set()
        self._poke_exits()

    def join(self, timeout: float | None = None) -> None:
        for thread in self._threads:
            thread.join(timeout)

    def is_alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    # --- leadership --------------------------------------------------------------------------------------------

    def _elect(self) -> None:
        retry = settings.JOBSITE_LEADER_RETRY_SECONDS
        try:
            while not self.stopping.is_set():
                leader = self.elector.acquire_or_renew()
                if leader and not self.leading.is_set():
                    self._lead()
                elif not leader and self.leading.is_set():
                    self._stand_by("lost the leadership")
                health.set_leader(self.leading.is_set())
                self.stopping.wait(retry)
        finally:
            if self.leading.is_set():
                self._stand_by("stopping")
            self.elector.release()
            health.set_leader(False)
            connections.close_all()

    def _lead(self) -> None:
        log.info("scheduler %s is the leader", self.elector.identity)
        install_actuator(self.backend, ACTUATOR_WORKERS)
        self.backend.start()  # e.g. the Kubernetes watches: a fresh list
        self._next_orphan_check = self._next_housekeeping = 0.0
        self.leading.set()
        self._wake_admission.set()
        self._wake_sync.set()
        self._poke_exits()

    def _stand_by(self, why: str) -> None:
        log.warning("scheduler %s stands by: %s", self.elector.identity, why)
        self.leading.clear()
        self._poke_exits()
        pooled = get_actuator(self.backend)
        install_actuator(self.backend, 0)  # no more backend calls from this process until it leads again
        pooled.shutdown()  # the calls under way end before the backend's watches and log copies do
        self.backend.close()

    # --- work --------------------------------------------------------------------------------------------------

    def _admission(self) -> None:
        self._rounds("admission", self._wake_admission, self._admission_round, rest=True)

    def _sync(self) -> None:
        # No rest: a sync round is what notices an exit and frees its GPUs; the wake-ups it answers are coalesced.
        self._rounds("sync", self._wake_sync, self._sync_round, rest=False)

    def _rounds(self, name: str, wake: threading.Event, work: Callable[[], None], rest: bool) -> None:
        while not self.stopping.is_set():
            wake.clear()
            began = time.monotonic()
            if self.leading.is_set():
                self._round(name, work)
            health.beat()
            worked = time.monotonic() - began
            if rest:
                # As long as the round took, before the next: wake-ups (submits, finishes) that come in a burst share
                # one pass, and passes never hold the process (its GIL, shared with the web server in the embedded
                # default) more than half the time. A quick pass adds as little delay.
                self.stopping.wait(min(worked, self.interval))
            wake.wait(max(0.0, self.interval - worked))
        connections.close_all()

    def _round(self, name: str, work: Callable[[], None]) -> bool:
        """One round; again at once, on a fresh connection, when its database connection failed (or none came from
        the pool in its timeout), up to ROUND_TRIES in all. Whether it succeeded; a failure is logged and counted,
        and never stops scheduling."""
        try:
            for tried in range(1, ROUND_TRIES + 1):
                try:
                    self._on_a_connection(work)
                    break
                except (OperationalError, InterfaceError) as exc:
                    if tried == ROUND_TRIES:
                        raise
                    metrics.ROUNDS_RETRIED.labels(name).inc()
                    log.warning("scheduler %s round lost its database connection (%s); running it again on a fresh "
                                "one", name, " ".join(str(exc).split()))
        except Exception:  # one bad round must not stop scheduling
            metrics.ROUNDS_FAILED.labels(name).inc()
            log.exception("scheduler %s round failed", name)
            return False
        return True

    @staticmethod
    def _on_a_connection(work: Callable[[], None]) -> None:
        close_old_connections()
        try:
            work()
        except (OperationalError, InterfaceError):
            # This thread's connections go back to the pool, which discards a broken one: the next is fresh.
            try:
                connections.close_all()
            except Exception as exc:  # closing a broken connection may fail as well
                log.debug("scheduler: closing a failed connection: %s", exc)
            raise

    def _admission_round(self) -> None:
        with metrics.PASS_SECONDS.time():
            schedule_pass(backend=self.backend)

    def _sync_round(self) -> None:
        with metrics.SYNC_SECONDS.time():
            sync_jobs(backend=self.backend)
            # The clocks (backoffs over, TTLs due) once an interval: exits wake sync rounds many times a second on a
            # busy machine, and each would read them again to find nothing new.
            if time.monotonic() >= self._next_housekeeping:
                self._next_housekeeping = time.monotonic() + self.interval
                housekeeping(backend=self.backend)
        telemetry_tick(self.backend)
        if time.monotonic() >= self._next_orphan_check:
            self._next_orphan_check = time.monotonic() + settings.JOBSITE_K8S_RESYNC_SECONDS
            orphans_delete(backend=self.backend)

    def _fan_out(self) -> None:
        """A wake-up wakes admission, and sync too when it asked for it (a stop; not a submit: jobs.wakeup)."""
        wake = wakeup_event()
        while not self.stopping.is_set():
            wake.wait()
            wake.clear()
            self._wake_admission.set()
            if sync_requested():
                self._wake_sync.set()

    def _exits(self) -> None:
        """Wait on the backend's exit socket (bound only while leading) and turn each report into a sync; the
        interval stays the fallback for a lost report."""
        warned = False
        try:
            while not self.stopping.is_set():
                self._leadership_changed.clear()
                if self.leading.is_set() and self._listener is None:
                    try:
                        self._listener = self.backend.exit_events()
                    except OSError as exc:  # tried again each interval; the periodic sync goes on meanwhile
                        (log.debug if warned else log.warning)(
                            "scheduler: cannot listen for exits (%s); syncing every %.1f s", exc, self.interval)
                        warned = True
                elif not self.leading.is_set() and self._listener is not None:
                    self._listener.close()
                    self._listener = None
                if self._listener is None:
                    self._leadership_changed.wait(self.interval)
                elif self._listener.wait(self.interval) and self.leading.is_set():
                    self._wake_sync.set()
        finally:
            if self._listener is not None:
                self._listener.close()
                self._listener = None

    def _poke_exits(self) -> None:
        """Have the exits thread look at the leadership (or stopping) now, not after its wait."""
        self._leadership_changed.set()
        listener = self._listener
        if listener is not None:
            listener.wake()

    def _listen(self) -> None:
        """Turn NOTIFYs from other processes (web, admin) into wake-ups."""
        while not self.stopping.is_set():
            try:
                with dedicated_connection() as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self.stopping.is_set():
                        for notify in conn.notifies(timeout=1.0, stop_after=1):
                            wake_here(sync=notify.payload != ADMISSION_ONLY)
            except Exception as exc:
                log.warning("scheduler: listening for wake-ups failed (%s); retrying", exc)
                self.stopping.wait(2.0)
