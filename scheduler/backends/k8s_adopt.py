"""Creating a pod whose name may already be taken, as Kubernetes' own controllers do.

Pod names are deterministic (``job-<id>-<attempt>-<rank>``), so a 409 AlreadyExists proves nothing by itself: the
pod found under the name is adopted only when it carries this installation (JOBSITE_INSTALLATION_ID) and this
attempt's uid, in its labels and annotations alike; then it is an earlier try that got through before its answer
was lost. This attempt's own pod that has ended (Succeeded or Failed: an interactive job restarted in place) is
replaced: its log archived, deleted (precondition: its uid) and created anew, as the Job controller replaces a
failed pod. Anyone else's pod (another installation in the namespace, or pods of a database restored from an
older backup) is left alone and the launch fails with ``PodConflict``, naming both owners.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.leader import FENCE
from scheduler.values import LaunchSpec

from .k8s_api import KubernetesUnavailable
from .k8s_manifest import LABEL_ATTEMPT_UID, LABEL_INSTALLATION, LABEL_REPLICA, owned_by

if TYPE_CHECKING:
    from .kubernetes import KubernetesBackend

log = logging.getLogger(__name__)

ENDED = ("Succeeded", "Failed")


class PodConflict(Exception):
    """A pod of the attempt's name exists and is not this attempt's (another installation, or a stale record)."""


def conflict_message(name: str, existing: dict, *, installation: str, attempt_id: int) -> str:
    labels = (existing.get("metadata") or {}).get("labels") or {}
    return (f"pod {name} already exists and is not this attempt's (it belongs to installation "
            f"{labels.get(LABEL_INSTALLATION, '-')!r}, attempt uid {labels.get(LABEL_ATTEMPT_UID, '-')!r}; this is "
            f"installation {installation!r}, attempt uid '{attempt_id}'): it was left alone")


def create_pod(backend: KubernetesBackend, spec: LaunchSpec, pod: dict, retries: int | None) -> bool:
    """Create ``pod``; True if this call created it, False if it adopted this attempt's own pod."""
    name = pod["metadata"]["name"]
    core, namespace = backend.core, backend.namespace
    FENCE.check(f"create pod {name}")
    try:
        backend._call(core.create_namespaced_pod, namespace, pod, retries=retries)
        return True
    except ApiException as exc:
        if exc.status != 409:
            raise
    existing = backend._pod(name)
    installation = backend.defaults.installation
    if existing is not None and not owned_by(existing, installation, spec.attempt_id):
        raise PodConflict(conflict_message(name, existing, installation=installation, attempt_id=spec.attempt_id))
    phase = ((existing or {}).get("status") or {}).get("phase")
    if existing is not None and phase not in ENDED:
        log.info("pod %s already exists: adopted (same attempt)", name)
        return False
    if existing is not None:
        metadata = existing.get("metadata") or {}
        rank = int((metadata.get("labels") or {}).get(LABEL_REPLICA, 0))
        backend.archive_log(job_id=spec.job_id, attempt_number=spec.attempt_number, rank=rank)
        uid = metadata.get("uid")
        backend._delete(core.delete_namespaced_pod, name, grace_period_seconds=0, body=client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid) if uid else None))
        if backend.pods_informer is not None:
            backend.pods_informer.remove(name)
        log.info("pod %s of the same attempt had ended (%s): deleted and created anew", name, phase)
    FENCE.check(f"create pod {name}")
    try:
        backend._call(core.create_namespaced_pod, namespace, pod, retries=retries)
    except ApiException as exc:
        if exc.status == 409:  # still going away: the scheduler tries the launch again
            raise KubernetesUnavailable(f"pod {name} is still being deleted") from exc
        raise
    return True
