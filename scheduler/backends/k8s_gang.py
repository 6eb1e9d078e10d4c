"""Gang start of a multi-replica attempt by the cluster's gang scheduler: its PodGroup and what its pods carry. Pure.

The default scheduler places an attempt's pods one by one: on a busy cluster some ranks run, holding their GPUs,
while the others wait. With JOBSITE_K8S_GANG_SCHEDULING set, an attempt of several replicas gets a PodGroup
(named like its headless Service, ``job-<id>-<attempt>``, with the attempt's labels) asking that all of them be
placed together or none:

- ``coscheduling``: the scheduler-plugins coscheduling plugin, a ``scheduling.x-k8s.io/v1alpha1`` PodGroup; its
  pods are labelled ``scheduling.x-k8s.io/pod-group: <name>``. The group gives up after ``scheduleTimeoutSeconds``,
  jobsite's preparing timeout, when jobsite requeues the attempt anyway.
- ``volcano``: a ``scheduling.volcano.sh/v1beta1`` PodGroup (Volcano's ``default`` queue); its pods are annotated
  ``scheduling.k8s.io/group-name: <name>`` and go to the scheduler ``volcano`` unless another name is set.

Both ask ``minMember`` = the replicas and ``minResources`` = the sum of what the replicas' pods request.
JOBSITE_K8S_SCHEDULER_NAME, when set, is every job pod's ``spec.schedulerName``, with or without gang scheduling,
so that one scheduler places all of jobsite's pods.

Without a gang scheduler the requeue is what keeps a partial start from holding GPUs: an attempt whose replicas are
not all running within JOBSITE_PREPARING_TIMEOUT_SECONDS is stopped whole and queued again (scheduler.reconcile).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from scheduler.values import LaunchSpec

from .k8s_manifest import attempt_labels, service_name

OFF = ""
COSCHEDULING = "coscheduling"
VOLCANO = "volcano"

COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER = "volcano"


@dataclass(frozen=True)
class PodGroupApi:
    """Where a gang scheduler's PodGroups live: a namespaced custom resource."""

    group: str
    version: str
    plural: str = "podgroups"
    kind: str = "PodGroup"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


APIS: dict[str, PodGroupApi] = {
    COSCHEDULING: PodGroupApi(group="scheduling.x-k8s.io", version="v1alpha1"),
    VOLCANO: PodGroupApi(group="scheduling.volcano.sh", version="v1beta1"),
}
MODES = (OFF, *APIS)


@dataclass(frozen=True)
class GangSettings:
    """JOBSITE_K8S_GANG_SCHEDULING, JOBSITE_K8S_SCHEDULER_NAME and the group's schedule timeout."""

    mode: str = OFF
    scheduler_name: str = ""  # spec.schedulerName of every job pod (empty: the cluster's default scheduler)
    schedule_timeout_seconds: int = 180

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ImproperlyConfigured(
                f"JOBSITE_K8S_GANG_SCHEDULING is {self.mode!r}: use '' (off), 'coscheduling' or 'volcano'")

    @classmethod
    def from_settings(cls) -> GangSettings:
        mode = str(settings.JOBSITE_K8S_GANG_SCHEDULING or "").strip().lower()
        name = str(settings.JOBSITE_K8S_SCHEDULER_NAME or "").strip()
        if mode == VOLCANO and not name:
            name = VOLCANO_SCHEDULER
        return cls(mode=mode, scheduler_name=name,
                   schedule_timeout_seconds=int(settings.JOBSITE_PREPARING_TIMEOUT_SECONDS))

    @property
    def api(self) -> PodGroupApi | None:
        """The PodGroup API in use; None when gang scheduling is off."""
        return APIS.get(self.mode)

    def gangs(self, replicas: int) -> bool:
        """Whether an attempt of this many replicas gets a PodGroup."""
        return self.api is not None and replicas > 1


def podgroup_name(job_id: int, attempt_number: int) -> str:
    return service_name(job_id, attempt_number)


# --- resources -------------------------------------------------------------------------------------------------


def _requests(container: dict) -> dict[str, Decimal]:
    """A container's requests; a resource with only a limit requests its limit (as the API server defaults it)."""
    from kubernetes.utils import parse_quantity

    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: Decimal(parse_quantity(str(value))) for name, value in merged.items()}


def pod_requests(pod: dict) -> dict[str, Decimal]:
    """What the scheduler reserves for a pod: per resource, the larger of its containers' sum and its largest init
    container (init containers run one at a time, before the others)."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for name, amount in _requests(container).items():
            total[name] = total.get(name, Decimal(0)) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in _requests(container).items():
            total[name] = max(total.get(name, Decimal(0)), amount)
    return total


def format_quantity(resource: str, amount: Decimal) -> str:
    """CPU in millicores; anything else as a whole number when it is one (bytes, GPUs), else in thousandths."""
    if resource == "cpu" or amount != amount.to_integral_value():
        return f"{math.ceil(amount * 1000)}m"
    return str(int(amount))


def min_resources(pods: list[dict]) -> dict[str, str]:
    """The sum of the pods' requests, as a Kubernetes ResourceList."""
    total: dict[str, Decimal] = {}
    for pod in pods:
        for name, amount in pod_requests(pod).items():
            total[name] = total.get(name, Decimal(0)) + amount
    return {name: format_quantity(name, amount) for name, amount in sorted(total.items()) if amount > 0}


# --- the builders -----------------------------------------------------------------------------------------------


def build_podgroup(spec: LaunchSpec, pods: list[dict], gang: GangSettings, *, namespace: str) -> dict[str, Any] | None:
    """The PodGroup of an attempt (``pods``: its built pods), or None when it gets none (one replica, or off)."""
    api = gang.api
    if api is None or not gang.gangs(len(spec.replicas)):
        return None
    group_spec: dict[str, Any] = {"minMember": len(spec.replicas)}
    resources = min_resources(pods)
    if resources:
        group_spec["minResources"] = resources
    if gang.mode == COSCHEDULING:
        group_spec["scheduleTimeoutSeconds"] = gang.schedule_timeout_seconds
    return {
        "apiVersion": api.api_version,
        "kind": api.kind,
        "metadata": {
            "name": podgroup_name(spec.job_id, spec.attempt_number),
            "namespace": namespace,
            "labels": attempt_labels(spec.job_id, spec.attempt_number),
        },
        "spec": group_spec,
    }


def gang_pods(spec: LaunchSpec, pods: list[dict], gang: GangSettings) -> list[dict]:
    """The pods as the gang scheduler wants them (copies): the scheduler's name on every pod, and for an attempt
    with a PodGroup the label (coscheduling) or annotation (volcano) naming it."""
    result = []
    name = podgroup_name(spec.job_id, spec.attempt_number)
    for pod in pods:
        pod = copy.deepcopy(pod)
        if gang.scheduler_name:
            pod["spec"]["schedulerName"] = gang.scheduler_name
        if gang.gangs(len(spec.replicas)):
            meta = pod["metadata"]
            if gang.mode == COSCHEDULING:
                meta["labels"] = {**(meta.get("labels") or {}), COSCHEDULING_LABEL: name}
            elif gang.mode == VOLCANO:
                meta["annotations"] = {**(meta.get("annotations") or {}), VOLCANO_ANNOTATION: name}
        result.append(pod)
    return result
