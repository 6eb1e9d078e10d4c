"""The pods and headless Service of an attempt, as Kubernetes API objects (plain dicts, camelCase). Pure: no I/O.

One pod per replica, named ``job-<id>-<attempt>-<rank>``; a multi-replica attempt also gets a headless Service
``job-<id>-<attempt>`` so that every replica reaches rank 0 at ``MASTER_ADDR`` (a single replica is its own rank 0,
at 127.0.0.1). Every pod carries the attempt's hostfile in an annotation, projected by a downwardAPI volume to
``/etc/jobsite/hostfile`` (``JOB_HOSTFILE``): no ConfigMap, no extra RBAC. The pod layout follows PrimeHub:
the working directory is an emptyDir at /home/jovyan with a size limit, the group volume is mounted at
/project/<group> and datasets at /datasets/<name>, both linked from the working directory by a small init
container.

The job is a boundary (DESIGN.md §4). Devices: a pod sees the GPUs the device plugin allocates to its ``nvidia.com/gpu``
limit (or the instance type's own resource, e.g. a MIG slice) and no others; a pod without GPUs gets
``NVIDIA_VISIBLE_DEVICES=void``, so that the NVIDIA container runtime injects no device even when the image sets
``NVIDIA_VISIBLE_DEVICES=all`` (as CUDA images do), and a job's own ``env`` can name no device (``DEVICE_ENV`` is
dropped from it). ``/dev/shm`` is a memory-backed emptyDir sized from the instance type (``shm_size_limit``). Network:
every attempt gets a NetworkPolicy of its own (``build_network_policy``) that lets its pods reach one another and
nothing else of the jobs namespace reach them; the static policies of deploy/base/networkpolicies.yaml deny the rest.

Every container gets what Pod Security `restricted` asks of it (no privilege escalation, all capabilities dropped but
those the instance type keeps, e.g. IPC_LOCK for InfiniBand, the runtime's default seccomp profile); the pod runs as
non-root when a user id is configured (``PodDefaults.run_as_user``), else as the image's user, which for many GPU images
is root: hence the jobs namespace enforces `baseline` (deploy/base/namespaces.yaml).
"""

from __future__ import annotations

import copy
import math
import re
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from kubernetes.utils import parse_quantity

from scheduler.values import LaunchReplica, LaunchSpec

from .base import hostfile_text, replica_launch_env

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "jobsite"
LABEL_JOB = "jobsite/job-id"
LABEL_ATTEMPT = "jobsite/attempt"
LABEL_REPLICA = "jobsite/replica"
LABEL_GROUP = "jobsite/group"
# Who made an object (JOBSITE_INSTALLATION_ID) and for which attempt (its database id): label and annotation both.
LABEL_INSTALLATION = "jobsite/installation"
LABEL_ATTEMPT_UID = "jobsite/attempt-uid"
SELECTOR = f"{MANAGED_BY}={MANAGER}"

CONTAINER = "main"
WORKDIR = "/home/jovyan"
MASTER_PORT = 29500
LOOPBACK = "127.0.0.1"  # rank 0 of a single-replica attempt is the pod itself
HOSTFILE_ANNOTATION = "jobsite/hostfile"
HOSTFILE_DIR = "/etc/jobsite"
HOSTFILE_PATH = f"{HOSTFILE_DIR}/hostfile"
GPU_RESOURCE = "nvidia.com/gpu"
TERMINATION_GRACE_SECONDS = 30
# The pod's own deadline is a backstop for when jobsite is down: jobsite times the job out first.
DEADLINE_MARGIN_SECONDS = 60
# What chooses a container's GPUs, dropped from a replica's env: the scheduler's local GPU ids mean nothing here, and
# the NVIDIA container runtime gives a container the devices NVIDIA_VISIBLE_DEVICES names (a value in the pod spec
# overrides the device plugin's allocation) and MIG configuration/monitoring rights by the other two. With GPUs the
# device plugin's allocation stands; without, NO_GPU_ENV. NVIDIA_DRIVER_CAPABILITIES is left to the job: it picks
# which driver libraries are mounted for the devices the container already has (video, graphics), none more.
DEVICE_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES",
                        "NVIDIA_MIG_MONITOR_DEVICES"})
# A pod without GPUs: no device and no driver library at all, even on a GPU node whose default runtime is NVIDIA's.
NO_GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "void"}
SHM_VOLUME = "dshm"


def pod_name(job_id: int, attempt_number: int, rank: int) -> str:
    return f"job-{job_id}-{attempt_number}-{rank}"


def service_name(job_id: int, attempt_number: int) -> str:
    return f"job-{job_id}-{attempt_number}"


def network_policy_name(job_id: int, attempt_number: int) -> str:
    return f"job-{job_id}-{attempt_number}"


def replica_hosts(spec: LaunchSpec) -> list[str]:
    """The address of each replica, in rank order: its DNS name under the headless Service, or the loopback
    address when the attempt has a single replica (and no Service)."""
    if len(spec.replicas) < 2:
        return [LOOPBACK]
    svc = service_name(spec.job_id, spec.attempt_number)
    return [f"{pod_name(spec.job_id, spec.attempt_number, r.rank)}.{svc}" for r in spec.replicas]


def attempt_labels(job_id: int, attempt_number: int) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, LABEL_JOB: str(job_id), LABEL_ATTEMPT: str(attempt_number)}


def installation_selector(installation: str) -> str:
    """The label selector of this installation's objects."""
    return f"{SELECTOR},{LABEL_INSTALLATION}={installation}"


def owner_marks(spec: LaunchSpec, defaults: PodDefaults) -> dict[str, str]:
    """Installation and attempt uid of every object an attempt creates (labels and annotations alike)."""
    return {LABEL_INSTALLATION: defaults.installation, LABEL_ATTEMPT_UID: str(spec.attempt_id)}


def is_managed(obj: dict) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY) == MANAGER


def is_ours(obj: dict, installation: str) -> bool:
    """Made by this installation of jobsite."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(MANAGED_BY) == MANAGER and labels.get(LABEL_INSTALLATION) == installation


def owned_by(obj: dict, installation: str, attempt_id: int) -> bool:
    """Made by this installation for this very attempt (label and annotation agree)."""
    metadata = obj.get("metadata") or {}
    want = {LABEL_INSTALLATION: installation, LABEL_ATTEMPT_UID: str(attempt_id)}
    return all((metadata.get(where) or {}).get(k) == v for where in ("labels", "annotations") for k, v in want.items())


def attempt_of(obj: dict) -> tuple[int, int, int | None] | None:
    """(job id, attempt number, rank or None) from an object's labels; None when they are missing or bad."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    try:
        rank = labels.get(LABEL_REPLICA)
        return int(labels[LABEL_JOB]), int(labels[LABEL_ATTEMPT]), int(rank) if rank is not None else None
    except (KeyError, TypeError, ValueError):
        return None


@dataclass(frozen=True)
class PodDefaults:
    """Cluster-wide pod settings (from JOBSITE_K8S_* settings)."""

    namespace: str
    workdir_size: str = "5Gi"
    image_pull_secrets: tuple[str, ...] = ()
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)
    affinity: dict = field(default_factory=dict)
    datasets: list[dict] = field(default_factory=list)
    # Run job containers as this uid/gid (runAsNonRoot); None: as the image's own user, which may be root.
    run_as_user: int | None = None
    run_as_group: int | None = None
    # /dev/shm of a replica: this fraction of its memory request, at most shm_max bytes (None: no cap).
    shm_fraction: float = 0.5
    shm_max: int | None = None
    installation: str = "jobsite"  # JOBSITE_INSTALLATION_ID
    gpu_resource: str = GPU_RESOURCE  # an instance type without its own gpu_resource
    priority_classes: dict[str, str] = field(default_factory=dict)  # job priority name -> priorityClassName
    ephemeral_request: str = ""  # ephemeral-storage per replica ("": none)
    ephemeral_limit: str = ""

    @classmethod
    def from_settings(cls, namespace: str | None = None) -> PodDefaults:
        return cls(
            namespace=namespace or settings.JOBSITE_K8S_NAMESPACE,
            workdir_size=settings.JOBSITE_K8S_WORKDIR_SIZE,
            image_pull_secrets=tuple(s for s in settings.JOBSITE_K8S_IMAGE_PULL_SECRETS if s),
            node_selector=dict(settings.JOBSITE_K8S_DEFAULT_NODE_SELECTOR or {}),
            tolerations=list(settings.JOBSITE_K8S_DEFAULT_TOLERATIONS or []),
            affinity=dict(settings.JOBSITE_K8S_DEFAULT_AFFINITY or {}),
            datasets=list(settings.JOBSITE_K8S_DATASETS or []),
            run_as_user=_optional_int(settings.JOBSITE_K8S_RUN_AS_USER),
            run_as_group=_optional_int(settings.JOBSITE_K8S_RUN_AS_GROUP),
            shm_fraction=_shm_fraction(settings.JOBSITE_K8S_SHM_FRACTION),
            shm_max=int(parse_quantity(settings.JOBSITE_K8S_SHM_MAX)) if settings.JOBSITE_K8S_SHM_MAX else None,
            installation=_installation(settings.JOBSITE_INSTALLATION_ID),
            gpu_resource=settings.JOBSITE_K8S_GPU_RESOURCE or GPU_RESOURCE,
            priority_classes={str(k): str(v) for k, v in (settings.JOBSITE_K8S_PRIORITY_CLASSES or {}).items() if v},
            ephemeral_request=_quantity("JOBSITE_K8S_EPHEMERAL_STORAGE_REQUEST",
                                        settings.JOBSITE_K8S_EPHEMERAL_STORAGE_REQUEST),
            ephemeral_limit=_quantity("JOBSITE_K8S_EPHEMERAL_STORAGE_LIMIT",
                                      settings.JOBSITE_K8S_EPHEMERAL_STORAGE_LIMIT),
        )


LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def _installation(value: Any) -> str:
    value = str(value or "")
    if not LABEL_VALUE.match(value):
        raise ImproperlyConfigured(f"JOBSITE_INSTALLATION_ID must be a label value (letters, digits, '-', '_', '.', "
                                   f"at most 63), not {value!r}")
    return value


def _quantity(name: str, value: Any) -> str:
    value = str(value or "").strip()
    if value:
        try:
            parse_quantity(value)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name} must be a quantity such as 20Gi, not {value!r}") from exc
    return value


def _optional_int(value: Any) -> int | None:
    return None if value in (None, "") else int(value)


def _shm_fraction(value: Any) -> float:
    fraction = float(value)
    if not 0 < fraction <= 1:
        raise ImproperlyConfigured(f"JOBSITE_K8S_SHM_FRACTION must be in (0, 1], not {value!r}")
    return fraction


# What Pod Security `restricted` requires of every container; none of it stops an ordinary training job.
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def pod_security_context(defaults: PodDefaults) -> dict[str, Any]:
    """seccomp RuntimeDefault always; the configured uid (runAsNonRoot unless it is 0) and gid when there are.

    No fsGroup: the kubelet would recursively change the group ownership of a group's shared volume to it.
    """
    context: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if defaults.run_as_user is not None:
        context["runAsUser"] = defaults.run_as_user
        if defaults.run_as_user != 0:
            context["runAsNonRoot"] = True
    if defaults.run_as_group is not None:
        context["runAsGroup"] = defaults.run_as_group
    return context


def group_volume_source(path: str) -> dict[str, Any]:
    """A pod volume source for Group.volume_path.

    ``pvc:<claim>`` or a bare name: that PersistentVolumeClaim; ``nfs://server/export``: an NFS export;
    an absolute path: a directory on the node (hostPath), e.g. a shared filesystem every node mounts.
    """
    path = path.strip()
    if path.startswith("pvc:"):
        return {"persistentVolumeClaim": {"claimName": path[4:]}}
    if path.startswith("nfs://"):
        server, _, export = path[len("nfs://"):].partition("/")
        return {"nfs": {"server": server, "path": "/" + export}}
    if path.startswith("/"):
        return {"hostPath": {"path": path, "type": "Directory"}}
    return {"persistentVolumeClaim": {"claimName": path}}


def merge_tolerations(defaults: list[dict], extra: list[dict]) -> list[dict]:
    """Defaults then the instance type's, without duplicates (same key, operator, value and effect)."""
    result, seen = [], set()
    for t in [*defaults, *extra]:
        key = (t.get("key"), t.get("operator", "Equal"), t.get("value"), t.get("effect"))
        if key not in seen:
            seen.add(key)
            result.append(dict(t))
    return result


def resources(request: dict[str, int], *, gpu_resource: str = GPU_RESOURCE, ephemeral_request: str = "",
              ephemeral_limit: str = "") -> dict[str, dict[str, str]]:
    """Requests equal to limits (Guaranteed QoS): CPU in millicores, memory in bytes, GPUs as ``gpu_resource``
    (nvidia.com/gpu, or a MIG slice such as nvidia.com/mig-1g.10gb); ephemeral storage as configured (it does not
    count towards QoS: the pod stays Guaranteed; a limit makes the kubelet evict a replica that writes more)."""
    amounts: dict[str, str] = {}
    if request.get("cpu"):
        amounts["cpu"] = f"{int(request['cpu'])}m"
    if request.get("memory"):
        amounts["memory"] = str(int(request["memory"]))
    if request.get("gpu"):
        amounts[gpu_resource or GPU_RESOURCE] = str(int(request["gpu"]))
    requests, limits = dict(amounts), dict(amounts)
    if ephemeral_request:
        requests["ephemeral-storage"] = ephemeral_request
    if ephemeral_limit:
        limits["ephemeral-storage"] = ephemeral_limit
    if not requests and not limits:
        return {}
    return {"requests": requests, "limits": limits}


def container_security_context(capabilities: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """``CONTAINER_SECURITY_CONTEXT``, adding back the instance type's capabilities (e.g. IPC_LOCK for InfiniBand)."""
    context = copy.deepcopy(CONTAINER_SECURITY_CONTEXT)
    extra = sorted({str(c).upper().removeprefix("CAP_") for c in capabilities if str(c).strip()})
    if extra:
        context["capabilities"]["add"] = extra
    return context


def shm_size_limit(request: dict[str, int], defaults: PodDefaults) -> str | None:
    """The sizeLimit of a replica's /dev/shm, in bytes: ``shm_fraction`` of its memory request, at most ``shm_max``.

    Pages of a memory-backed emptyDir count against the container's memory limit, so a fraction below 1 leaves the
    job room for its processes; the kubelet evicts a pod whose /dev/shm outgrows the limit. No memory request: the
    cap, or None (the kubelet then sizes the tmpfs by the pod's memory limit or the node's memory).
    """
    memory = int(request.get("memory") or 0)
    sizes = [int(memory * defaults.shm_fraction)] if memory else []
    if defaults.shm_max is not None:
        sizes.append(defaults.shm_max)
    return str(max(min(sizes), 1)) if sizes else None


def shm_volume_source(request: dict[str, int], defaults: PodDefaults) -> dict[str, Any]:
    limit = shm_size_limit(request, defaults)
    return {"medium": "Memory", **({"sizeLimit": limit} if limit else {})}


def device_env(env: dict[str, str], gpus: int) -> dict[str, str]:
    """A replica's env without what chooses devices (``DEVICE_ENV``); a pod without GPUs gets ``NO_GPU_ENV`` last."""
    result = {k: v for k, v in env.items() if k not in DEVICE_ENV}
    return result if gpus > 0 else {**result, **NO_GPU_ENV}


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _datasets_for(spec: LaunchSpec, defaults: PodDefaults) -> list[dict]:
    """The configured datasets this job's group may use (names must be DNS labels: they name volumes)."""
    return [d for d in defaults.datasets
            if DNS_LABEL.match(str(d.get("name", ""))) and (not d.get("groups") or spec.group in d["groups"])]


def build_service(spec: LaunchSpec, defaults: PodDefaults) -> dict[str, Any] | None:
    """The headless Service of a multi-replica attempt (its pods' DNS names), or None for one replica."""
    if len(spec.replicas) < 2:
        return None
    labels = {**attempt_labels(spec.job_id, spec.attempt_number), LABEL_INSTALLATION: defaults.installation}
    marks = owner_marks(spec, defaults)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(spec.job_id, spec.attempt_number),
            "namespace": defaults.namespace,
            "labels": {**labels, **marks},
            "annotations": dict(marks),
        },
        "spec": {
            "clusterIP": "None",
            "selector": dict(labels),
            "publishNotReadyAddresses": True,
            "ports": [{"name": "dist", "port": MASTER_PORT, "targetPort": MASTER_PORT, "protocol": "TCP"}],
        },
    }


def build_network_policy(spec: LaunchSpec, defaults: PodDefaults) -> dict[str, Any]:
    """The attempt's NetworkPolicy: its pods accept traffic from, and send it to, the attempt's own pods only.

    Policies add up: what else reaches a job pod, or leaves it, is what the static policies of the jobs namespace
    allow (deploy/base/networkpolicies.yaml: no ingress but the site's proxy; DNS and the internet out). A static
    policy cannot say "a pod of the same job", hence one per attempt, created before its pods and deleted with them.
    An attempt rather than a job: the pods of an attempt being replaced never meet those of the next.
    """
    labels = {**attempt_labels(spec.job_id, spec.attempt_number), LABEL_INSTALLATION: defaults.installation}
    marks = owner_marks(spec, defaults)
    same_attempt = [{"podSelector": {"matchLabels": dict(labels)}}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(spec.job_id, spec.attempt_number),
            "namespace": defaults.namespace,
            "labels": {**labels, **marks},
            "annotations": dict(marks),
        },
        "spec": {
            "podSelector": {"matchLabels": dict(labels)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": copy.deepcopy(same_attempt)}],
            "egress": [{"to": copy.deepcopy(same_attempt)}],
        },
    }


def build_pod(spec: LaunchSpec, replica: LaunchReplica, defaults: PodDefaults, *, now: datetime) -> dict[str, Any]:
    name = pod_name(spec.job_id, spec.attempt_number, replica.rank)
    marks = owner_marks(spec, defaults)
    labels = {**attempt_labels(spec.job_id, spec.attempt_number), LABEL_REPLICA: str(replica.rank), **marks}
    if spec.group:
        labels[LABEL_GROUP] = spec.group
    annotations = {k: v for k, v in {"jobsite/job-name": spec.job_name, "jobsite/user": spec.user}.items() if v}
    annotations.update(marks)
    hosts = replica_hosts(spec)
    annotations[HOSTFILE_ANNOTATION] = hostfile_text(hosts, gpus=int(spec.request.get("gpu", 0)))

    env = replica_launch_env(spec, replica, master_addr=hosts[0], master_port=MASTER_PORT, hostfile=HOSTFILE_PATH)
    env = device_env(env, int(spec.request.get("gpu", 0)))
    multi = len(spec.replicas) > 1

    volumes: list[dict] = [
        {"name": "workdir", "emptyDir": {"sizeLimit": defaults.workdir_size}},
        {"name": SHM_VOLUME, "emptyDir": shm_volume_source(spec.request, defaults)},
        {"name": "hostfile", "downwardAPI": {"items": [{
            "path": "hostfile", "fieldRef": {"fieldPath": f"metadata.annotations['{HOSTFILE_ANNOTATION}']"},
        }]}},
    ]
    mounts: list[dict] = [
        {"name": "workdir", "mountPath": WORKDIR},
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        {"name": "hostfile", "mountPath": HOSTFILE_DIR, "readOnly": True},
    ]
    links: list[tuple[str, str]] = []
    if spec.group_volume and spec.group:
        volumes.append({"name": "group", **group_volume_source(spec.group_volume)})
        mounts.append({"name": "group", "mountPath": f"/project/{spec.group}"})
        links.append((f"/project/{spec.group}", f"{WORKDIR}/{spec.group}"))
    datasets = _datasets_for(spec, defaults)
    for d in datasets:
        volume = f"dataset-{d['name']}"
        volumes.append({"name": volume, **d.get("volume", {})})
        mounts.append({"name": volume, "mountPath": f"/datasets/{d['name']}", "readOnly": True})
    if datasets:
        links.append(("/datasets", f"{WORKDIR}/datasets"))

    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "command": ["/bin/bash", "-c", spec.command],
        "workingDir": WORKDIR,
        "env": [{"name": k, "value": str(v)} for k, v in env.items()],
        "volumeMounts": mounts,
        "securityContext": container_security_context(spec.capabilities),
    }
    container_resources = resources(spec.request, gpu_resource=spec.gpu_resource or defaults.gpu_resource,
                                    ephemeral_request=defaults.ephemeral_request,
                                    ephemeral_limit=defaults.ephemeral_limit)
    if container_resources:
        container["resources"] = container_resources

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Always" if spec.job_type == "interactive" else "Never",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(defaults),
        "containers": [container],
        "volumes": volumes,
    }
    if links:
        script = "set -e; " + "; ".join(f"ln -sfn {shlex.quote(src)} {shlex.quote(dst)}" for src, dst in links)
        pod_spec["initContainers"] = [{
            "name": "workdir-links",
            "image": spec.image,
            "command": ["/bin/sh", "-c", script],
            "volumeMounts": [{"name": "workdir", "mountPath": WORKDIR}],
            "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
        }]
    node_selector = {**defaults.node_selector, **(spec.node_selector or {})}
    if node_selector:
        pod_spec["nodeSelector"] = {k: str(v) for k, v in node_selector.items()}
    tolerations = merge_tolerations(defaults.tolerations, spec.tolerations or [])
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if defaults.affinity:
        pod_spec["affinity"] = defaults.affinity
    if defaults.priority_classes.get(spec.priority):
        pod_spec["priorityClassName"] = defaults.priority_classes[spec.priority]
    if defaults.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in defaults.image_pull_secrets]
    if spec.deadline is not None:
        remaining = math.ceil((spec.deadline - now).total_seconds())
        pod_spec["activeDeadlineSeconds"] = max(remaining, 1) + DEADLINE_MARGIN_SECONDS
    if multi:
        pod_spec["hostname"] = name
        pod_spec["subdomain"] = service_name(spec.job_id, spec.attempt_number)

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": defaults.namespace, "labels": labels, "annotations": annotations},
        "spec": pod_spec,
    }


def build_attempt(spec: LaunchSpec, defaults: PodDefaults, *, now: datetime) -> tuple[dict | None, list[dict]]:
    """The Service (or None) and the pods of an attempt, in creation order."""
    return build_service(spec, defaults), [build_pod(spec, r, defaults, now=now) for r in spec.replicas]
