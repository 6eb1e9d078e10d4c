"""Exactly one active scheduler: leader election.

- ``LeaseElector``: a ``coordination.k8s.io`` Lease (the default with the kubernetes backend). The holder renews it
  every ``retry`` seconds; a standby takes it over once the record has not changed for ``lease`` seconds, measured on
  its own clock from when it first saw that record (so clocks of different nodes need not agree). A leader that
  could not renew for the renew deadline (JOBSITE_LEADER_RENEW_DEADLINE_SECONDS, below the lease) steps down
  before anyone may take over. Patches carry the resourceVersion
  read as a precondition, so of two standbys racing for an expired lease the API server lets one win (409 for the
  other). (The test emulator does not check resourceVersions: there the race is not covered.)
- ``AdvisoryLockElector``: a PostgreSQL session advisory lock on a connection of its own; the lock goes with the
  connection, so a killed leader's lock is released when PostgreSQL notices the connection is gone.
- ``SoleElector``: SQLite, the single embedded process: always the leader.

``elector_from_settings()`` picks one from JOBSITE_LEADER_ELECTION (default: lease with the kubernetes backend,
advisory on PostgreSQL, else sole).

Fencing: with a Lease, ``FENCE`` is the elector's ``holds``, and the Kubernetes backend checks it right before
every create and delete it sends (``FENCE.check``). A leader deposed while a launch or a stop was in flight on
another thread (or that stalled past its renew deadline) has that call refused with ``Deposed``: the new leader
alone changes the cluster.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from django.conf import settings
from django.db import connections

log = logging.getLogger(__name__)


class Deposed(Exception):
    """A cluster-changing action refused: this scheduler no longer surely holds the leadership."""


class Fence:
    """What every cluster-changing action checks first: whether this process still holds the leader lease.
    Open (no check) until an elector is put in (``use``): processes without a Lease, tests."""

    def __init__(self) -> None:
        self._holds: Callable[[], bool] | None = None
        self._lock = threading.Lock()

    def use(self, holds: Callable[[], bool] | None) -> None:
        with self._lock:
            self._holds = holds

    def check(self, action: str) -> None:
        with self._lock:
            holds = self._holds
        if holds is not None and not holds():
            raise Deposed(f"refused to {action}: this scheduler no longer holds the leader lease")


FENCE = Fence()

ADVISORY_KEY = 0x6A6F6273  # "jobs"


def dedicated_connection(alias: str = "default"):
    """A psycopg connection of its own (autocommit) to Django's database: for a session lock or LISTEN, which
    must not share Django's per-thread connection."""
    import psycopg

    params = connections[alias].get_connection_params()
    params.pop("cursor_factory", None)
    params.setdefault("connect_timeout", 10)
    return psycopg.connect(**params, autocommit=True)


def identity() -> str:
    """Who this scheduler is: its pod name in Kubernetes (POD_NAME), else host and process id."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class Elector(Protocol):
    identity: str

    def acquire_or_renew(self) -> bool:
        """One round: True if this process is the leader now (call every retry interval)."""

    def release(self) -> None:
        """Give leadership up at once (on a clean shutdown), so a standby need not wait for the lease to expire."""


class SoleElector:
    def __init__(self) -> None:
        self.identity = identity()

    def acquire_or_renew(self) -> bool:
        return True

    def release(self) -> None:
        pass


class AdvisoryLockElector:
    def __init__(self, alias: str = "default", key: int = ADVISORY_KEY):
        self.identity = identity()
        self.alias = alias
        self.key = key
        self._conn = None
        self._held = False

    def acquire_or_renew(self) -> bool:
        import psycopg

        try:
            if self._conn is None or self._conn.closed:
                self._held = False
                self._conn = dedicated_connection(self.alias)
            if self._held:
                self._conn.execute("SELECT 1")  # still connected: the lock is still ours
            else:
                self._held = bool(self._conn.execute("SELECT pg_try_advisory_lock(%s)", [self.key]).fetchone()[0])
        except psycopg.Error as exc:
            log.warning("leader election: lost the database connection (%s)", exc)
            self._close()
        return self._held

    def release(self) -> None:
        self._close()

    def _close(self) -> None:
        self._held = False
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
        self._conn = None


class LeaseElector:
    def __init__(self, coordination, *, name: str, namespace: str, lease_seconds: float,
                 renew_deadline: float | None = None, clock=time.monotonic):
        self.identity = identity()
        self.api = coordination
        self.name = name
        self.namespace = namespace
        self.lease_seconds = lease_seconds
        # Below the lease: the leader stops acting before any standby may take over.
        self.renew_deadline = min(renew_deadline or lease_seconds * 2 / 3, lease_seconds * 2 / 3)
        self.clock = clock
        self._observed: tuple | None = None  # (holder, renewTime, resourceVersion) last seen
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # when we last renewed, while leader

    def acquire_or_renew(self) -> bool:
        now = self.clock()
        try:
            leading = self._round(now)
        except Exception as exc:  # the API is unreachable or refused
            log.warning("leader election: %s", exc)
            leading = False
        if leading:
            self._renewed_at = now
            return True
        # Could not renew: keep acting only while the lease we hold surely has not expired for the others.
        if self.holds():
            return True
        self._renewed_at = None
        return False

    def holds(self) -> bool:
        """Whether this process is the leader now: it renewed the lease within the renew deadline (the fence of
        every cluster-changing action, checked on whichever thread acts)."""
        renewed = self._renewed_at
        return renewed is not None and self.clock() - renewed < self.renew_deadline

    def _round(self, now: float) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=(5, 5))
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                self.api.create_namespaced_lease(self.namespace, self._body(None, transitions=0),
                                                 _request_timeout=(5, 5))
            except ApiException as create_exc:
                if create_exc.status == 409:  # someone else created it first
                    return False
                raise
            log.info("leader election: %s created lease %s/%s", self.identity, self.namespace, self.name)
            return True
        spec = lease.spec
        holder = spec.holder_identity or ""
        record = (holder, spec.renew_time, lease.metadata.resource_version)
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = spec.lease_duration_seconds or self.lease_seconds
        if holder and holder != self.identity and now - self._observed_at < duration:
            return False  # someone else holds a live lease
        transitions = (spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
        body = self._body(lease, transitions=transitions,
                          acquired=spec.acquire_time if holder == self.identity else None)
        try:
            self.api.patch_namespaced_lease(self.name, self.namespace, body, _request_timeout=(5, 5))
        except ApiException as exc:
            if exc.status == 409:  # changed since we read it: someone else renewed or took it
                return False
            raise
        if holder != self.identity:
            log.info("leader election: %s took lease %s/%s over from %r", self.identity, self.namespace, self.name,
                     holder)
        return True

    def _body(self, lease, *, transitions: int, acquired: datetime | None = None) -> dict:
        now = datetime.now(UTC)
        metadata = {"name": self.name, "namespace": self.namespace}
        if lease is not None and lease.metadata.resource_version:
            metadata["resourceVersion"] = lease.metadata.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.lease_seconds),
                "acquireTime": _micro(acquired or now),
                "renewTime": _micro(now),
                "leaseTransitions": transitions,
            },
        }

    def release(self) -> None:
        """Hand the lease back: an empty holder that standbys may take at once."""
        if self._renewed_at is None:
            return
        self._renewed_at = None
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=(5, 5))
            if (lease.spec.holder_identity or "") != self.identity:
                return
            body = self._body(lease, transitions=lease.spec.lease_transitions or 0)
            body["spec"]["holderIdentity"] = ""
            body["spec"]["leaseDurationSeconds"] = 1
            self.api.patch_namespaced_lease(self.name, self.namespace, body, _request_timeout=(5, 5))
        except Exception as exc:
            log.warning("leader election: could not release the lease: %s", exc)


def _micro(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def election_kind() -> str:
    kind = settings.JOBSITE_LEADER_ELECTION
    if kind:
        return kind
    if settings.JOBSITE_BACKEND == "kubernetes":
        return "lease"
    if connections["default"].vendor == "postgresql":
        return "advisory"
    return "none"


def elector_from_settings() -> Elector:
    kind = election_kind()
    if kind == "lease":
        from kubernetes import client

        from .backends.kubernetes import load_api_client

        elector = LeaseElector(
            client.CoordinationV1Api(load_api_client()),
            name=settings.JOBSITE_LEADER_LEASE_NAME,
            namespace=settings.JOBSITE_LEADER_NAMESPACE or settings.JOBSITE_K8S_NAMESPACE,
            lease_seconds=settings.JOBSITE_LEADER_LEASE_SECONDS,
            renew_deadline=settings.JOBSITE_LEADER_RENEW_DEADLINE_SECONDS,
        )
        FENCE.use(elector.holds)
        return elector
    if kind == "advisory":
        return AdvisoryLockElector()
    if kind == "none":
        return SoleElector()
    raise ValueError(f"Unknown JOBSITE_LEADER_ELECTION '{kind}' (expected lease, advisory or none)")
