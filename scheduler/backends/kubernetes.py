"""The Kubernetes backend: one pod per replica through the official client, kept true by list+watch.

- launch: the attempt's PodGroup (multi-replica, with JOBSITE_K8S_GANG_SCHEDULING: ``k8s_gang``), NetworkPolicy,
  headless Service (multi-replica) and pods, built by ``k8s_manifest``, in that order; transient API errors (5xx,
  429, timeouts) are retried with backoff, 409 AlreadyExists adopts a pod only when it is this attempt's own
  (``k8s_adopt``: installation and attempt uid; else a ``LaunchError`` naming the owner), any other 4xx is a
  ``LaunchError`` (a cluster refusing the NetworkPolicy fails the launch: no job pod runs unisolated).
  A launch cut short by an API outage (``KubernetesUnavailable``) is tried again by the scheduler's actuator.
- observe: reads an informer's cache of the managed pods (a direct GET when the cache has no answer), maps each
  pod with ``k8s_status.observe_pod`` and hands running replicas to the log keeper (``k8s_log_keeping``: new
  lines only, on the archiver's threads). ``events`` hands out the pods' Kubernetes Events not yet recorded
  (``k8s_events``); the scheduler records them.
- stop / cleanup / delete_orphans: always archive what is left of a pod's log before deleting it; the attempt's
  Service and PodGroup go with its pods, its NetworkPolicy once they are gone (cleanup, or delete_orphans after a
  stop: pods in their grace period still reach each other). ``delete_orphans`` (the leader's sync, every
  JOBSITE_K8S_RESYNC_SECONDS) deletes this installation's pods, services, NetworkPolicies and (gang scheduling on)
  PodGroups of no live attempt, as its caller says which are live. All is watched and listed by this installation's
  label (JOBSITE_INSTALLATION_ID). Every create and delete checks ``scheduler.leader.FENCE`` first (fencing).
- nodes: the Ready nodes' allocatable GPUs/CPU/memory (``k8s_nodes``), read by a thread of their own when
  JOBSITE_K8S_CHECK_CAPACITY is on (none when it is off): asking never waits on the API.

Only the scheduler process builds this backend; the leader starts its watches (``start``), a standby stops them
(``close``).

The verbs it uses are listed in ``RBAC_RULES`` and ``NETWORK_RBAC_RULES``; deploy/base/rbac.yaml grants exactly
those (a test checks both).
With gang scheduling on it also calls ``GANG_RBAC_RULES`` in the PodGroup's API group, which
deploy/components/gang-<mode> grants.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler import metrics
from scheduler.leader import FENCE
from scheduler.values import LaunchSpec, Node, ReplicaObservation

from .base import BackendDefaults, BackendEvent, LaunchError, LiveAttempts, LogLayout
from .k8s_adopt import PodConflict, create_pod
from .k8s_api import api_message, call, load_api_client
from .k8s_events import fresh_events, is_job_pod_event
from .k8s_gang import GangSettings, build_podgroup, gang_pods, podgroup_name
from .k8s_informer import Informer
from .k8s_log_keeping import PodLogKeeper
from .k8s_logs import LogArchiver
from .k8s_manifest import (
    TERMINATION_GRACE_SECONDS,
    PodDefaults,
    attempt_of,
    build_attempt,
    build_network_policy,
    installation_selector,
    is_ours,
    network_policy_name,
    owner_marks,
    pod_name,
    service_name,
)
from .k8s_nodes import NodeHealthCache, list_node_items, read_nodes
from .k8s_status import node_suspect, observe_pod

log = logging.getLogger(__name__)

# What the backend calls, as RBAC rules (resource -> verbs) of the core API group. Namespaced: a Role.
RBAC_RULES: dict[str, frozenset[str]] = {
    "pods": frozenset({"create", "get", "list", "watch", "delete"}),
    "pods/log": frozenset({"get"}),
    "services": frozenset({"create", "list", "delete"}),
    "events": frozenset({"list", "watch"}),
}
# Every attempt's NetworkPolicy (k8s_manifest.build_network_policy), in the jobs namespace: the same Role.
NETWORK_API_GROUP = "networking.k8s.io"
NETWORK_RBAC_RULES: dict[str, frozenset[str]] = {"networkpolicies": frozenset({"create", "list", "delete"})}
# Only with JOBSITE_K8S_GANG_SCHEDULING, in the jobs namespace and the API group of its PodGroups
# (k8s_gang.APIS[mode].group): a Role of its own (deploy/components/gang-coscheduling, gang-volcano).
GANG_RBAC_RULES: dict[str, frozenset[str]] = {"podgroups": frozenset({"create", "list", "delete"})}
# Cluster-scoped, only with JOBSITE_K8S_CHECK_CAPACITY: a ClusterRole (deploy/components/capacity).
CAPACITY_RBAC_RULES: dict[str, frozenset[str]] = {"nodes": frozenset({"list"})}
# Leader election (scheduler.leader): the scheduler's Lease, in the control plane's own namespace.
LEASE_API_GROUP = "coordination.k8s.io"
LEASE_RBAC_RULES: dict[str, frozenset[str]] = {"leases": frozenset({"get", "create", "patch"})}


class KubernetesBackend(BackendDefaults):
    name = "kubernetes"

    # Every backend made (tests stop their watches through this).
    instances: weakref.WeakSet[KubernetesBackend] = weakref.WeakSet()

    def __init__(
        self,
        api_client: client.ApiClient | None = None,
        *,
        namespace: str | None = None,
        log_root: Path | str | None = None,
        log_layout: LogLayout,
    ):
        self._api_client = api_client
        self.namespace = namespace or settings.JOBSITE_K8S_NAMESPACE
        self.log_root = Path(log_root or settings.JOBSITE_LOG_ROOT)
        self.log_layout = log_layout
        self.defaults = PodDefaults.from_settings(self.namespace)
        self.gang = GangSettings.from_settings()
        self.retries = settings.JOBSITE_K8S_API_RETRIES
        self.retry_base = settings.JOBSITE_K8S_API_RETRY_BASE_SECONDS
        self.image_pull_grace = settings.JOBSITE_K8S_IMAGE_PULL_GRACE_SECONDS
        self.log_refresh = settings.JOBSITE_K8S_LOG_REFRESH_SECONDS
        self._start_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._pods: Informer | None = None
        self._events: Informer | None = None
        self._seen_events: set[tuple[str, int]] = set()
        self._nodes: list[Node] | None = None  # the last read of the nodes (capacity checking)
        self._nodes_read = threading.Event()
        self._nodes_thread: threading.Thread | None = None
        self._node_health = NodeHealthCache(lambda: list_node_items(self.core, self._call))  # lost nodes
        self._closing = threading.Event()
        KubernetesBackend.instances.add(self)

    # --- plumbing ----------------------------------------------------------------------------------------

    @cached_property
    def api_client(self) -> client.ApiClient:
        return self._api_client or load_api_client()

    @cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client)

    @cached_property
    def networking(self) -> client.NetworkingV1Api:
        return client.NetworkingV1Api(self.api_client)

    @cached_property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api_client)

    @cached_property
    def logs(self) -> PodLogKeeper:
        return PodLogKeeper(core=self.core, namespace=self.namespace, root=self.log_root, layout=self.log_layout,
                            workers=settings.JOBSITE_K8S_LOG_WORKERS, refresh_seconds=self.log_refresh)

    @property
    def selector(self) -> str:
        """The label selector of this installation's objects (JOBSITE_INSTALLATION_ID): never another's."""
        return installation_selector(self.defaults.installation)

    def is_ours(self, obj: dict) -> bool:
        return is_ours(obj, self.defaults.installation)

    def _call(self, fn: Callable[..., Any], *args: Any, retries: int | None = None, **kwargs: Any) -> Any:
        """Call the API, retrying transient failures with doubling backoff; other errors are raised at once."""
        return call(fn, *args, retries=self.retries if retries is None else retries, retry_base=self.retry_base,
                    **kwargs)

    def _delete(self, fn: Callable[..., Any], name: str, **kwargs: Any) -> bool:
        """Delete, treating 404 as done. True if something was deleted. Refused once deposed (``FENCE``)."""
        FENCE.check(f"delete {name}")
        try:
            self._call(fn, name, self.namespace, **kwargs)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    # --- informers ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start watching the managed pods and their events (idempotent; done lazily by observe and nodes)."""
        with self._start_lock:
            if self._pods is None:
                common = dict(resync_seconds=settings.JOBSITE_K8S_RESYNC_SECONDS,
                              watch_timeout=settings.JOBSITE_K8S_WATCH_TIMEOUT_SECONDS, retry_base=self.retry_base)
                self._pods = Informer(
                    name="pods", list_func=self.core.list_namespaced_pod, namespace=self.namespace,
                    list_kwargs={"label_selector": self.selector}, accept=self.is_ours, **common,
                )
                self._events = Informer(
                    name="events", list_func=self.core.list_namespaced_event, namespace=self.namespace,
                    list_kwargs={"field_selector": "involvedObject.kind=Pod"}, accept=is_job_pod_event,
                    index=lambda e: (e.get("involvedObject") or {}).get("name"), **common,
                )
                metrics.register_informer(self._pods)
                metrics.register_informer(self._events)
                metrics.register_pods_source(self.cached_pods)
            self._pods.start()
            self._events.start()
            if settings.JOBSITE_K8S_CHECK_CAPACITY and (self._nodes_thread is None
                                                        or not self._nodes_thread.is_alive()):
                self._closing.clear()
                self._nodes_thread = threading.Thread(target=self._poll_nodes, name="k8s-nodes", daemon=True)
                self._nodes_thread.start()

    def close(self) -> None:
        """Stop the watches, the node reads and the log copies (their threads end at once)."""
        self._closing.set()
        for informer in (self._pods, self._events):
            if informer is not None:
                informer.stop()
        self.logs.close()

    @property
    def archiver(self) -> LogArchiver:
        return self.logs.archiver

    @property
    def pods_informer(self) -> Informer | None:
        return self._pods

    @property
    def events_informer(self) -> Informer | None:
        return self._events

    # --- the interface -----------------------------------------------------------------------------------

    def nodes(self) -> list[Node] | None:
        """The Ready nodes' allocatable resources as last read (every JOBSITE_K8S_RESYNC_SECONDS, by a thread of
        their own), when capacity checking is on; none when it is off. Waits only for the very first read (None:
        not read yet, the nodes last recorded stand)."""
        if not settings.JOBSITE_K8S_CHECK_CAPACITY:
            return []
        self.start()
        self._nodes_read.wait(10)
        return self._nodes

    def _poll_nodes(self) -> None:
        while not self._closing.is_set():
            try:
                self._nodes = self.read_nodes()
                self._nodes_read.set()
            except Exception as exc:  # keep the last read; the Node table keeps the last recorded
                log.warning("reading the nodes failed: %s", exc)
            self._closing.wait(min(settings.JOBSITE_K8S_RESYNC_SECONDS, 30.0))

    def read_nodes(self) -> list[Node]:
        return read_nodes(self.core, self._call, self.defaults.node_selector)

    def stuck_after(self) -> float:
        """Pods deleted with the job's grace period are force-deleted only when still there this long after."""
        return float(TERMINATION_GRACE_SECONDS + settings.JOBSITE_K8S_STUCK_TERMINATION_SECONDS)

    def launch(self, spec: LaunchSpec, *, retries: int | None = None) -> dict:
        key = (spec.job_id, spec.attempt_number)
        service, pods = build_attempt(spec, self.defaults, now=timezone.now())
        pods = gang_pods(spec, pods, self.gang)
        podgroup = build_podgroup(spec, pods, self.gang, namespace=self.namespace)
        if podgroup is not None:  # this installation's, for delete_orphans
            podgroup["metadata"].setdefault("labels", {}).update(owner_marks(spec, self.defaults))
        policy = build_network_policy(spec, self.defaults)
        creating = "pods"
        try:
            api = self.gang.api
            if podgroup is not None and api is not None:  # first: the gang scheduler holds pods of unknown groups
                creating = f"PodGroup ({api.api_version})"
                self._create(self.custom.create_namespaced_custom_object, podgroup, retries,
                             args=(api.group, api.version, self.namespace, api.plural))
            creating = "NetworkPolicy"  # before the pods: they never run unisolated, and find each other at once
            self._create(self.networking.create_namespaced_network_policy, policy, retries)
            creating = "pods"
            made_service = service is not None and self._create(self.core.create_namespaced_service, service, retries)
            created: list[str] = []
            for pod in pods:
                if self._create_pod(spec, pod, retries):
                    created.append(pod["metadata"]["name"])
        except PodConflict as exc:  # someone else's pod has the name: leave it, remove only what this launch made
            try:
                for name in created:
                    self._delete(self.core.delete_namespaced_pod, name, grace_period_seconds=0)
                if made_service:
                    self._delete(self.core.delete_namespaced_service, service["metadata"]["name"])
            except Exception:
                log.exception("could not remove what was created of job %s attempt %s", *key)
            raise LaunchError(str(exc)) from exc
        except ApiException as exc:  # rejected (422 invalid, 403 forbidden or over a ResourceQuota, ...)
            try:
                self._delete_attempt(spec.job_id, spec.attempt_number, len(spec.replicas), force=True, policy=True)
            except Exception:
                log.exception("could not remove what was created of job %s attempt %s", *key)
            raise LaunchError(f"Kubernetes rejected the {creating} of attempt {spec.attempt_number}: "
                              f"{exc.status} {api_message(exc)}") from exc
        data = {
            "namespace": self.namespace,
            "pods": [p["metadata"]["name"] for p in pods],
            "service": service["metadata"]["name"] if service else "",
            "networkpolicy": policy["metadata"]["name"],
        }
        if podgroup is not None:
            data["podgroup"] = podgroup["metadata"]["name"]
        return data

    def _create(self, fn: Callable[..., Any], body: dict, retries: int | None, *,
                args: tuple[Any, ...] | None = None) -> bool:
        """Create ``body`` (``fn(*args, body)``; args: the namespace), treating 409 AlreadyExists as done (pods:
        ``_create_pod``, which checks whose it is). True if this call created it. Refused once deposed."""
        FENCE.check(f"create {body['kind']} {body['metadata']['name']}")
        try:
            self._call(fn, *(args or (self.namespace,)), body, retries=retries)
            return True
        except ApiException as exc:
            if exc.status != 409:
                raise
            # Already exists: an earlier try got through before its answer was lost. Same name, same attempt.
            log.info("%s %s already exists", body["kind"], body["metadata"]["name"])
            return False

    def _create_pod(self, spec: LaunchSpec, pod: dict, retries: int | None) -> bool:
        """Create a pod, adopting only this attempt's own (``k8s_adopt``); True if this call created it."""
        return create_pod(self, spec, pod, retries)

    def stop(self, *, job_id: int, attempt_number: int, replicas: int, force: bool = False) -> None:
        self._delete_attempt(job_id, attempt_number, replicas, force=force, archive=True)

    def cleanup(self, *, job_id: int, attempt_number: int, replicas: int) -> None:
        self._delete_attempt(job_id, attempt_number, replicas, force=False, archive=True, policy=True)
        for rank in range(replicas):
            self.logs.forget(pod_name(job_id, attempt_number, rank))

    def _delete_attempt(self, job_id: int, attempt_number: int, replicas: int, *, force: bool,
                        archive: bool = False, policy: bool = False) -> None:
        """Delete the pods (their logs archived first with ``archive``), the Service and the PodGroup; with ``policy``
        the NetworkPolicy too. A stop keeps the policy: pods in their grace period may still be finishing a
        collective or a checkpoint with each other; the leader's ``delete_orphans`` deletes it once the attempt
        has ended (and ``cleanup`` with the ended pods)."""
        grace = 0 if force else TERMINATION_GRACE_SECONDS
        for rank in range(replicas):
            name = pod_name(job_id, attempt_number, rank)
            if archive:
                self.archive_log(job_id=job_id, attempt_number=attempt_number, rank=rank)
            self._delete(self.core.delete_namespaced_pod, name, grace_period_seconds=grace)
        if replicas > 1:
            self._delete(self.core.delete_namespaced_service, service_name(job_id, attempt_number))
            if self.gang.gangs(replicas):
                self._delete_podgroup(podgroup_name(job_id, attempt_number))
        if policy:
            self._delete(self.networking.delete_namespaced_network_policy, network_policy_name(job_id, attempt_number))

    def _delete_podgroup(self, name: str) -> bool:
        """Delete a PodGroup of the configured API, treating 404 as done. True if something was deleted."""
        api = self.gang.api
        assert api is not None
        FENCE.check(f"delete PodGroup {name}")
        try:
            self._call(self.custom.delete_namespaced_custom_object, api.group, api.version, self.namespace,
                       api.plural, name)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    def observe(self, *, job_id: int, attempt_number: int, replicas: int) -> list[ReplicaObservation]:
        self.start()
        now = timezone.now()
        result = []
        pods = [self._pod(pod_name(job_id, attempt_number, rank)) for rank in range(replicas)]
        health = self._node_health.get() if any(node_suspect(p) for p in pods) else None
        for rank, pod in enumerate(pods):
            name = pod_name(job_id, attempt_number, rank)
            obs = observe_pod(pod, rank=rank, name=name, now=now, image_pull_grace=self.image_pull_grace,
                              lost_nodes=health.lost if health else None, known_nodes=health.known if health else None)
            if pod is not None:
                self.logs.keep(job_id=job_id, attempt_number=attempt_number, rank=rank, name=name, pod=pod, obs=obs)
            result.append(obs)
        return result

    def log_path(self, *, job_id: int, attempt_number: int, rank: int) -> Path:
        return self.logs.path(job_id=job_id, attempt_number=attempt_number, rank=rank)

    # --- pods ----------------------------------------------------------------------------------------------

    def _pod(self, name: str) -> dict | None:
        """The pod from the cache; when the cache has not synced or lacks it, from the API (None: it is gone)."""
        informer = self._pods
        if informer is not None and informer.synced.is_set():
            pod = informer.get(name)
            if pod is not None:
                return pod
        try:
            resp = self._call(self.core.read_namespaced_pod, name, self.namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        # Not put into the cache: a DELETED event may already have passed it, and the watch brings it anyway.
        return json.loads(resp.data)

    def cached_pods(self) -> list[dict] | None:
        """The managed pods as the watch knows them; None while it has not listed them (for /metrics)."""
        informer = self._pods
        return informer.items() if informer is not None and informer.synced.is_set() else None

    def managed_pods(self) -> list[dict]:
        informer = self._pods
        if informer is not None and informer.synced.is_set():
            return informer.items()
        data = json.loads(self._call(self.core.list_namespaced_pod, self.namespace, label_selector=self.selector,
                                     _preload_content=False).data or b"{}")
        return [p for p in data.get("items") or [] if self.is_ours(p)]

    # --- logs and events ---------------------------------------------------------------------------------

    def archive_log(self, *, job_id: int, attempt_number: int, rank: int) -> bool:
        """Copy what is left of a replica's log into its archive (before its pod goes). False if the API failed."""
        return self.logs.finish(job_id=job_id, attempt_number=attempt_number, rank=rank)

    def events(self, *, job_id: int, attempt_number: int, replicas: int) -> list[BackendEvent]:
        """The Kubernetes Events of the attempt's pods not recorded yet (none until the events are listed)."""
        informer = self._events
        if informer is None or not informer.synced.is_set():
            return []
        with self._state_lock:
            seen = set(self._seen_events)
        return fresh_events(informer, [pod_name(job_id, attempt_number, rank) for rank in range(replicas)], seen)

    def events_recorded(self, keys: set[tuple[str, int]]) -> None:
        with self._state_lock:
            self._seen_events.update(keys)

    # --- orphans -----------------------------------------------------------------------------------------

    def delete_orphans(self, *, live: LiveAttempts) -> list[str]:
        """Delete managed pods, services, NetworkPolicies and PodGroups of no live attempt (logs archived first).

        ``live`` is asked only once the objects are read, so one launched meanwhile always finds its (committed)
        attempt among them. PodGroups are read (and their API called at all) only with gang scheduling on.
        """
        pods = self.managed_pods()
        data = json.loads(self._call(self.core.list_namespaced_service, self.namespace, label_selector=self.selector,
                                     _preload_content=False).data or b"{}")
        services = [s for s in data.get("items") or [] if self.is_ours(s)]
        data = json.loads(self._call(self.networking.list_namespaced_network_policy, self.namespace,
                                     label_selector=self.selector, _preload_content=False).data or b"{}")
        policies = [p for p in data.get("items") or [] if self.is_ours(p)]
        podgroups = self._managed_podgroups()
        live_now = live()
        deleted = []
        for pod in pods:
            owner = attempt_of(pod)
            name = pod["metadata"]["name"]
            if owner is not None and owner[:2] in live_now:
                continue
            if owner is not None and owner[2] is not None:
                self.archive_log(job_id=owner[0], attempt_number=owner[1], rank=owner[2])
            if self._delete(self.core.delete_namespaced_pod, name, grace_period_seconds=TERMINATION_GRACE_SECONDS):
                log.info("deleted pod %s: it belongs to no live attempt", name)
                deleted.append(name)
            if self._pods is not None:
                self._pods.remove(name)
        for kind, objects, delete in (("service", services, self.core.delete_namespaced_service),
                                      ("networkpolicy", policies, self.networking.delete_namespaced_network_policy)):
            for obj in objects:
                owner = attempt_of(obj)
                if owner is not None and owner[:2] in live_now:
                    continue
                name = obj["metadata"]["name"]
                if self._delete(delete, name):
                    deleted.append(name if kind == "service" else f"{kind}/{name}")
        for group in podgroups:
            owner = attempt_of(group)
            if owner is not None and owner[:2] in live_now:
                continue
            name = group["metadata"]["name"]
            if self._delete_podgroup(name):
                log.info("deleted PodGroup %s: it belongs to no live attempt", name)
                deleted.append(f"podgroup/{name}")
        events = self._events.items() if self._events is not None and self._events.synced.is_set() else None
        present = {p["metadata"]["name"] for p in pods} - set(deleted)
        for name in deleted:
            self.archiver.forget(name)
        self.logs.keep_only(present)  # forget what we kept about pods and events that are gone
        with self._state_lock:
            if events is not None:
                ids = {(e.get("metadata") or {}).get("uid") or (e.get("metadata") or {}).get("name") for e in events}
                self._seen_events = {key for key in self._seen_events if key[0] in ids}
        return deleted

    def _managed_podgroups(self) -> list[dict]:
        """The PodGroups jobsite made, with gang scheduling on; none (and no API call) when it is off."""
        api = self.gang.api
        if api is None:
            return []
        data = json.loads(self._call(self.custom.list_namespaced_custom_object, api.group, api.version,
                                     self.namespace, api.plural, label_selector=self.selector,
                                     _preload_content=False).data or b"{}")
        return [g for g in data.get("items") or [] if self.is_ours(g)]
