"""Starting an admitted attempt's replicas on the backend: its launch spec and environment, the launch itself
(claimed once in the database, so a retried or repeated call starts nothing twice) and the in-place relaunch of
interactive jobs. The actuator runs these after the admission has committed, off the admission thread."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from django.db import transaction

from jobs import services
from jobs.choices import Phase, Priority
from jobs.models import Attempt, Job
from jobs.ports import base_url
from jobs.prepared import Prepared

from .backends.base import Backend, LaunchError
from .values import LaunchReplica, LaunchSpec

JOB_TO_LAUNCH = Prepared(lambda pk: Job.objects.select_related("current_attempt", "group", "user", "instance_type",
                                                           "image").filter(pk=pk), pk=int)

STILL_PREPARING = Prepared(lambda pk, attempt_id: Job.objects.filter(pk=pk, phase=Phase.PREPARING,
                                                                     current_attempt_id=attempt_id)
                           .values_list("pk", flat=True), pk=int, attempt_id=int)


def attempt_launch(job_id: int, *, backend: Backend, launch: Callable[[LaunchSpec], dict] | None = None) -> None:
    """Start the processes/pods of a job's current attempt. Runs after the admission has committed.

    ``launch`` makes the backend call (default: ``backend.launch``; the actuator's remembers a launch cut short)."""
    job = JOB_TO_LAUNCH.get(pk=job_id)
    attempt = job.current_attempt
    if job.phase != Phase.PREPARING or attempt is None:
        return
    # Claim the launch: exactly one caller (the pass's after-commit hook or a later sync) starts it.
    if not services.attempt_claim_launch(attempt=attempt):
        return
    spec = launch_spec(job, attempt)
    # Cancelled (or otherwise moved on) since it was read: nothing starts. A cancel after this check finds the
    # launch claimed and stops the attempt; the backend keeps a stopped replica from starting its command.
    if not STILL_PREPARING.all(pk=job.pk, attempt_id=attempt.pk):
        return
    try:
        data = (launch or backend.launch)(spec)
    except LaunchError as exc:
        with transaction.atomic():
            services.job_transition(job=job, phase=Phase.FAILED, status="Fail", reason="ContainerCannotRun",
                                    message=str(exc))
        return
    # "Started" is written by the sync that first sees a replica running (reconcile), not here: a launch is no start.
    services.attempt_record_launch(attempt=attempt, backend_data=data or {})


def launch_spec(job: Job, attempt: Attempt) -> LaunchSpec:
    return LaunchSpec(
        job_id=job.pk,
        attempt_id=attempt.pk,
        attempt_number=attempt.number,
        command=job.command,
        image=job.image_url,
        image_root=job.image.local_root,
        replicas=[
            LaunchReplica(
                rank=rank,
                node=attempt.placement.get(str(rank), {}).get("node", ""),
                gpu_ids=tuple(attempt.placement.get(str(rank), {}).get("gpu_ids", [])),
                env=replica_env(job, attempt.number, rank),
            )
            for rank in range(attempt.replicas)
        ],
        job_name=job.name,
        job_type=job.job_type,
        user=job.user.get_username(),
        group=job.group.name,
        group_volume=job.group.volume_path,
        request={str(k): v for k, v in job.request.items()},
        node_selector=dict(job.instance_type.node_selector or {}),
        tolerations=list(job.instance_type.tolerations or []),
        gpu_resource=job.instance_type.gpu_resource,
        capabilities=list(job.instance_type.capabilities or []),
        priority=dict(Priority.choices).get(job.priority, str(job.priority)),
        deadline=job.admitted_at and job.admitted_at + timedelta(seconds=job.active_deadline_seconds),
    )


def attempt_relaunch(job_id: int, *, backend: Backend, launch: Callable[[LaunchSpec], dict] | None = None) -> None:
    """Start the replicas of the current attempt again, in place (interactive jobs)."""
    job = JOB_TO_LAUNCH.get(pk=job_id)
    if job.phase == Phase.RUNNING and job.current_attempt is not None:
        (launch or backend.launch)(launch_spec(job, job.current_attempt))


def replica_env(job: Job, attempt_number: int, rank: int) -> dict[str, str]:
    """A replica's own environment: the job's variables, then who and what it is (jobsite's names win).

    The distributed variables (rank, world size, rendezvous, hostfile) are added by the backend at launch with
    ``replica_launch_env``, since only the backend knows its addresses and ports.
    """
    gpu_ids = (job.current_attempt.placement.get(str(rank), {}) if job.current_attempt else {}).get("gpu_ids", [])
    user, group = job.user.get_username(), job.group.name
    return {
        **{k: str(v) for k, v in job.env.items()},
        "JOB_ID": str(job.pk),
        "JOB_NAME": job.name,
        "JOB_USER": user,
        "JOB_GROUP": group,
        "PRIMEHUB_USER": user,
        "PRIMEHUB_GROUP": group,
        "JOB_ATTEMPT": str(attempt_number),
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_ids),
        # Its web apps' path through the site (/jobs/<id>/ports/<port>/), when it declares ports.
        **({"JOB_BASE_URL": base_url(job.pk, job.ports)} if job.ports else {}),
    }
