"""One scheduling pass: snapshot → decide (pure, scheduler.core) → apply under row locks → launch after commit.

Two passes never over-commit: apply holds the row locks of every group while it reads usage and admits, so a
second pass waits and then sees the first one's admissions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from jobs import services
from jobs.choices import QUEUED_PHASES, RESOURCE_PHASES, Phase
from jobs.models import Group, GroupQuota, Job
from jobs.selectors import held_resources, nodes_with_usage
from jobs.state_machine import InvalidTransition

from . import metrics
from .actuator import get_actuator
from .backends import get_backend
from .backends.base import Backend
from .core import (
    GroupState,
    Node,
    Outcome,
    QueuedJob,
    QuotaLimits,
    Reason,
    ReplicaPlacement,
    RunningJob,
    Verdict,
    decide,
)

log = logging.getLogger(__name__)


@dataclass
class PassResult:
    admitted: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    waiting: int = 0
    inadmissible: int = 0


@dataclass
class Snapshot:
    groups: dict[int, GroupState]
    queued: list[QueuedJob]
    running: list[RunningJob]
    nodes: list[Node]
    shown: dict[int, QueueInfo]  # what each queued job shows now, to write only what changed


QueueInfo = tuple[str, str, str, int | None]  # phase, reason, message, queue position


def snapshot(backend: Backend) -> Snapshot:
    """Read everything the decision needs in a handful of queries."""
    groups = {g.id: GroupState(id=g.id, name=g.name, queue_stopped=g.queue_stopped) for g in Group.objects.all()}
    for q in GroupQuota.objects.all():
        groups[q.group_id].quotas[q.resource] = QuotaLimits(q.quota, q.limit, q.user_quota)
    usage = (
        Job.objects.filter(phase__in=RESOURCE_PHASES)
        .values("group_id", "user_id")
        .annotate(**held_resources())
    )
    for row in usage:
        g = groups[row["group_id"]]
        per_user = g.user_usage.setdefault(row["user_id"], {})
        for r in ("gpu", "cpu", "memory"):
            g.usage[r] = g.usage.get(r, 0) + (row[r] or 0)
            per_user[r] = per_user.get(r, 0) + (row[r] or 0)

    queued, shown = [], {}
    rows = Job.objects.filter(phase__in=QUEUED_PHASES).values(
        "id", "name", "group_id", "user_id", "priority", "queued_at", "replicas", "gpu", "cpu_millicores",
        "memory_bytes", "preemptible", "phase", "reason", "message", "queue_position", "retry_at",
    )
    for j in rows:  # a plain fetch: a server-side cursor makes PostgreSQL pick a slow fast-start plan here
        queued.append(QueuedJob(
            id=j["id"], name=j["name"], group_id=j["group_id"], user_id=j["user_id"], priority=j["priority"],
            queued_at=j["queued_at"], replicas=j["replicas"], preemptible=j["preemptible"], not_before=j["retry_at"],
            request={"gpu": j["gpu"], "cpu": j["cpu_millicores"], "memory": j["memory_bytes"]},
            nominated=j["phase"] == Phase.PENDING and j["reason"] == Reason.PREEMPTING,
        ))
        shown[j["id"]] = (j["phase"], j["reason"], j["message"], j["queue_position"])
    running = [
        RunningJob(
            id=j["id"], name=j["name"], group_id=j["group_id"], priority=j["priority"],
            preemptible=j["preemptible"], replicas=j["replicas"], admitted_at=j["admitted_at"],
            request={"gpu": j["gpu"], "cpu": j["cpu_millicores"], "memory": j["memory_bytes"]},
            over_quota=j["over_quota"], terminating=j["phase"] == Phase.TERMINATING,
            placement=tuple(ReplicaPlacement(p.get("node", ""), tuple(p.get("gpu_ids", [])))
                            for p in (j["current_attempt__placement"] or {}).values()),
        )
        # Only what decide() can use: preemptible jobs (victims; over-quota ones are preemptible) and terminating
        # ones (resources soon free), not every running job.
        for j in Job.objects.filter(Q(preemptible=True) | Q(phase=Phase.TERMINATING), phase__in=RESOURCE_PHASES).values(
            "id", "name", "group_id", "priority", "preemptible", "replicas", "admitted_at", "gpu", "cpu_millicores",
            "memory_bytes", "over_quota", "phase", "current_attempt__placement",
        )
    ]
    return Snapshot(groups, queued, running, nodes_with_free(backend.name), shown)


def nodes_with_free(backend: str) -> list[Node]:
    """The nodes the scheduler last recorded for ``backend``, minus what the attempts holding resources have placed
    on them (database only: nothing here waits on the cluster while the group rows are locked)."""
    return [Node(name=n.name, allocatable=n.allocatable, free=n.free, free_gpu_ids=n.free_gpu_ids)
            for n in nodes_with_usage(backend)]


def schedule_pass(*, backend: Backend | None = None, now: datetime | None = None) -> PassResult:
    backend = backend or get_backend()
    result = PassResult()
    refresh_nodes(backend)  # before the locks: the backend answers from memory
    with transaction.atomic():
        # The scheduling lock: every group row, in a stable order.
        list(Group.objects.select_for_update().order_by("id").values_list("id", flat=True))
        snap = snapshot(backend)
        outcomes = decide(snap.groups, snap.queued, snap.nodes, snap.running, now=now or timezone.now())
        requests = {j.id: j for j in snap.queued}
        refreshed: dict[int, tuple[str, int | None]] = {}
        for outcome in outcomes:
            try:
                if outcome.verdict == Verdict.PREEMPT:
                    services.job_preempt(job=Job(pk=outcome.job_id), by_job_id=outcome.by, message=outcome.message,
                                         now=now)
                    result.preempted.append(outcome.job_id)
                    continue
                phase, reason, message, position = snap.shown[outcome.job_id]
                if outcome.verdict == Verdict.ADMIT:
                    _admit(outcome, phase, requests[outcome.job_id], backend, now)
                    result.admitted.append(outcome.job_id)
                    continue
                target = Phase.PENDING if outcome.verdict == Verdict.WAIT else Phase.INADMISSIBLE
                if (phase, reason) != (target, outcome.reason):
                    services.job_transition(
                        job=Job(pk=outcome.job_id), phase=target, reason=str(outcome.reason),
                        status="Inadmissible" if target == Phase.INADMISSIBLE else None,
                        message=outcome.message, queue_position=outcome.position, now=now,
                    )
                elif (message, position) != (outcome.message, outcome.position):
                    refreshed[outcome.job_id] = (outcome.message, outcome.position)
            except InvalidTransition:  # cancelled meanwhile: its row lock showed the new phase
                continue
            if outcome.verdict == Verdict.WAIT:
                result.waiting += 1
            else:
                result.inadmissible += 1
        services.job_queue_info_update(refreshed)
        admitted = list(result.admitted)
        transaction.on_commit(lambda: launch_jobs(admitted, backend=backend))
        waited = [requests[i].queued_at for i in admitted]
        transaction.on_commit(lambda: [metrics.observe_admission(queued_at) for queued_at in waited])
    return result


def refresh_nodes(backend: Backend) -> None:
    """Record the backend's nodes in the database (the Node table), for admission and the pages. The backend
    answers from what it already knows (no cluster call here); None: it does not know yet, keep the last rows."""
    nodes = backend.nodes()
    if nodes is None:
        return
    services.nodes_record(backend=backend.name, nodes={n.name: dict(n.allocatable) for n in nodes})


def _admit(outcome: Outcome, phase: str, queued: QueuedJob, backend: Backend, now: datetime | None) -> None:
    job = Job.objects.get(pk=outcome.job_id)
    if phase != Phase.PENDING:  # SUBMITTED or INADMISSIBLE: into the queue first, so the trail says so
        services.job_transition(job=job, phase=Phase.PENDING, reason="Queued", now=now)
    placement = [{"node": p.node, "gpu_ids": list(p.gpu_ids)} for p in outcome.placement]
    services.job_admit(job=job, backend=backend.name, placement=placement or [{"node": ""}] * queued.replicas,
                       over_quota=outcome.over_quota, nominated=queued.nominated, now=now)


def launch_jobs(job_ids: list[int], *, backend: Backend) -> None:
    """Hand the admitted jobs to the actuator (its pool in the scheduler loop): admission never waits on them."""
    actuator = get_actuator(backend)
    for job_id in job_ids:
        actuator.launch(job_id)
