"""Which pod a ticket opens, and whether the gateway may open it: only a Running pod of this installation carrying
the ticket's job, attempt and rank (a ticket cannot name a pod by name, nor one that jobsite did not make)."""

from __future__ import annotations

import json

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.backends.k8s_api import api_message
from scheduler.backends.k8s_manifest import (
    CONTAINER,
    LABEL_ATTEMPT,
    LABEL_INSTALLATION,
    LABEL_JOB,
    LABEL_REPLICA,
    MANAGED_BY,
    MANAGER,
    pod_name,
)


class Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def expected_labels(*, installation: str, job: int, attempt: int, rank: int) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, LABEL_INSTALLATION: installation, LABEL_JOB: str(job),
            LABEL_ATTEMPT: str(attempt), LABEL_REPLICA: str(rank)}


def pod_check(pod: dict, *, installation: str, job: int, attempt: int, rank: int) -> None:
    """Refused unless ``pod`` (as the API returns it) is this installation's replica ``rank`` of that attempt, and
    Running."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    want = expected_labels(installation=installation, job=job, attempt=attempt, rank=rank)
    if any(labels.get(k) != v for k, v in want.items()):
        raise Refused(403, f"pod {pod.get('metadata', {}).get('name')} is not this site's replica {rank} of "
                           f"job {job}, attempt {attempt}")
    phase = (pod.get("status") or {}).get("phase")
    if phase != "Running":
        raise Refused(409, f"replica {rank} of job {job} is {phase or 'not started'}, not Running")


def pod_open(core: client.CoreV1Api, namespace: str, *, installation: str, job: int, attempt: int,
             rank: int) -> str:
    """The name of the pod the ticket opens, once checked; Refused otherwise."""
    name = pod_name(job, attempt, rank)
    try:
        response = core.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=(10, 30))
        pod = json.loads(response.data)
    except ApiException as exc:
        if exc.status == 404:
            raise Refused(404, f"no pod {name}") from exc
        raise Refused(502, f"the cluster's API refused reading pod {name}: {api_message(exc)}") from exc
    except (OSError, ValueError) as exc:
        raise Refused(502, f"the cluster's API cannot be reached: {exc}") from exc
    pod_check(pod, installation=installation, job=job, attempt=attempt, rank=rank)
    return name


def exit_from_status(raw: bytes | str) -> tuple[int | None, str]:
    """(exit code, message) from the exec error channel's Status: Success is 0, a NonZeroExitCode carries its code in
    ``details.causes`` (reason ExitCode); anything else is no code, with its message."""
    try:
        status = json.loads(raw or b"null")
    except ValueError:
        status = None
    if not isinstance(status, dict):
        return None, "the command's end was not reported"
    if status.get("status") == "Success":
        return 0, ""
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message")), str(status.get("message") or "")
            except (TypeError, ValueError):
                break
    return None, str(status.get("message") or status.get("reason") or "the command failed")


__all__ = ["CONTAINER", "Refused", "exit_from_status", "pod_check", "pod_open"]
