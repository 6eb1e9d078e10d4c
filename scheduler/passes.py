"""One scheduling pass: snapshot → decide (pure, scheduler.core) → apply under row locks → launch after commit.

Two passes never over-commit: apply holds the row locks of every group while it reads usage and admits, so a
second pass waits and then sees the first one's admissions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from jobs import services
from jobs.choices import QUEUED_PHASES, RESOURCE_PHASES, Phase
from jobs.models import Group, GroupQuota, Job
from jobs.selectors import DurationHistory, job_duration_history, nodes_with_usage
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
from .estimate import HeldJob, estimate

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
    holding: list[HeldJob] = field(default_factory=list)  # every job holding resources, for the estimates
    kinds: dict[int, JobKind] = field(default_factory=dict)  # queued and holding jobs: what their history is of
    estimates: dict[int, tuple[datetime | None, str]] = field(default_factory=dict)  # shown now, per queued job


QueueInfo = tuple[str, str, str, int | None]  # phase, reason, message, queue position
JobKind = tuple[int, int, str, int, int]  # user, group, name, instance type, active deadline (seconds)


def snapshot(backend: Backend) -> Snapshot:
    """Read everything the decision and the estimates need in a handful of queries."""
    groups = {g.id: GroupState(id=g.id, name=g.name, queue_stopped=g.queue_stopped) for g in Group.objects.all()}
    for q in GroupQuota.objects.all():
        groups[q.group_id].quotas[q.resource] = QuotaLimits(q.quota, q.limit, q.user_quota)

    queued, shown, kinds, estimates = [], {}, {}, {}
    rows = Job.objects.filter(phase__in=QUEUED_PHASES).values(
        "id", "name", "group_id", "user_id", "priority", "queued_at", "replicas", "gpu", "cpu_millicores",
        "memory_bytes", "preemptible", "phase", "reason", "message", "queue_position", "retry_at",
        "instance_type_id", "active_deadline_seconds", "estimated_start", "estimate_basis",
    )
    for j in rows:  # a plain fetch: a server-side cursor makes PostgreSQL pick a slow fast-start plan here
        queued.append(QueuedJob(
            id=j["id"], name=j["name"], group_id=j["group_id"], user_id=j["user_id"], priority=j["priority"],
            queued_at=j["queued_at"], replicas=j["replicas"], preemptible=j["preemptible"], not_before=j["retry_at"],
            request={"gpu": j["gpu"], "cpu": j["cpu_millicores"], "memory": j["memory_bytes"]},
            nominated=j["phase"] == Phase.PENDING and j["reason"] == Reason.PREEMPTING,
        ))
        shown[j["id"]] = (j["phase"], j["reason"], j["message"], j["queue_position"])
        kinds[j["id"]] = (j["user_id"], j["group_id"], j["name"], j["instance_type_id"], j["active_deadline_seconds"])
        estimates[j["id"]] = (j["estimated_start"], j["estimate_basis"])

    # Every job holding resources, in one query: its usage (group and user), and for the estimates where it runs
    # and since when; decide() gets only those it can use: preemptible jobs (victims; over-quota ones are
    # preemptible) and terminating ones (resources soon free).
    running, holding = [], []
    for j in Job.objects.filter(phase__in=RESOURCE_PHASES).values(
        "id", "name", "group_id", "user_id", "priority", "preemptible", "replicas", "admitted_at", "gpu",
        "cpu_millicores", "memory_bytes", "over_quota", "phase", "current_attempt__placement", "instance_type_id",
        "active_deadline_seconds",
    ):
        request = {"gpu": j["gpu"], "cpu": j["cpu_millicores"], "memory": j["memory_bytes"]}
        g = groups[j["group_id"]]
        per_user = g.user_usage.setdefault(j["user_id"], {})
        for r, amount in request.items():
            g.usage[r] = g.usage.get(r, 0) + amount * j["replicas"]
            per_user[r] = per_user.get(r, 0) + amount * j["replicas"]
        placement = tuple(ReplicaPlacement(p.get("node", ""), tuple(p.get("gpu_ids", [])))
                          for p in (j["current_attempt__placement"] or {}).values())
        terminating = j["phase"] == Phase.TERMINATING
        admitted_at = j["admitted_at"] or timezone.now()
        holding.append(HeldJob(id=j["id"], group_id=j["group_id"], user_id=j["user_id"], replicas=j["replicas"],
                               request=request, admitted_at=admitted_at, placement=placement, terminating=terminating))
        kinds[j["id"]] = (j["user_id"], j["group_id"], j["name"], j["instance_type_id"], j["active_deadline_seconds"])
        if j["preemptible"] or terminating:
            running.append(RunningJob(
                id=j["id"], name=j["name"], group_id=j["group_id"], priority=j["priority"],
                preemptible=j["preemptible"], replicas=j["replicas"], admitted_at=admitted_at, request=request,
                over_quota=j["over_quota"], terminating=terminating, placement=placement,
            ))
    return Snapshot(groups, queued, running, nodes_with_free(backend.name), shown, holding, kinds, estimates)


def nodes_with_free(backend: str) -> list[Node]:
    """The nodes the scheduler last recorded for ``backend``, minus what the attempts holding resources have placed
    on them (database only: nothing here waits on the cluster while the group rows are locked)."""
    return [Node(name=n.name, allocatable=n.allocatable, free=n.free, free_gpu_ids=n.free_gpu_ids)
            for n in nodes_with_usage(backend)]


def schedule_pass(*, backend: Backend | None = None, now: datetime | None = None) -> PassResult:
    backend = backend or get_backend()
    result = PassResult()
    clock = now or timezone.now()
    refresh_nodes(backend)  # before the locks: the backend answers from memory
    history = duration_history(clock)  # before the locks too: at most one query a minute
    with transaction.atomic():
        # The scheduling lock: every group row, in a stable order.
        list(Group.objects.select_for_update().order_by("id").values_list("id", flat=True))
        snap = snapshot(backend)
        outcomes = decide(snap.groups, snap.queued, snap.nodes, snap.running, now=clock)
        waiting: list[int] = []
        requests = {j.id: j for j in snap.queued}
        refreshed: dict[int, tuple[str, int | None]] = {}
        victims = Job.objects.in_bulk([o.job_id for o in outcomes if o.verdict == Verdict.PREEMPT])
        for outcome in outcomes:
            try:
                if outcome.verdict == Verdict.PREEMPT:
                    if outcome.job_id in victims:
                        services.job_preempt(job=victims[outcome.job_id], by_job_id=outcome.by,
                                             message=outcome.message, now=now)
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
                waiting.append(outcome.job_id)
            else:
                result.inadmissible += 1
        services.job_queue_info_update(refreshed)
        admitted = list(result.admitted)
        transaction.on_commit(lambda: launch_jobs(admitted, backend=backend))
        waited = [requests[i].queued_at for i in admitted]
        transaction.on_commit(lambda: [metrics.observe_admission(queued_at) for queued_at in waited])
    # After the scheduling lock is released: the simulation is CPU work no other pass need wait for, and the write
    # touches only jobs still pending.
    services.job_estimate_update(estimate_changes(snap, outcomes, history, clock, waiting))
    return result


# --- estimated start times -------------------------------------------------------------------------------------

HISTORY_SPAN = timedelta(days=30)  # how far back similar jobs' run times are looked for
HISTORY_TTL = timedelta(seconds=60)  # how long the scheduler reuses them
ESTIMATE_SLACK = timedelta(seconds=60)  # an estimate that moved less is not written again
_history: tuple[datetime, DurationHistory] | None = None


def duration_history(now: datetime) -> DurationHistory:
    """How long similar recent jobs ran: read at most once a minute of the pass clock (one query)."""
    global _history
    if _history is None or not timedelta(0) <= now - _history[0] < HISTORY_TTL:
        _history = (now, job_duration_history(since=now - HISTORY_SPAN))
    return _history[1]


def duration_history_clear() -> None:
    global _history
    _history = None


def estimate_changes(snap: Snapshot, outcomes: list[Outcome], history: DurationHistory, now: datetime,
                     waiting: list[int]) -> dict[int, tuple[datetime | None, str]]:
    """The estimated start of each job left waiting by this pass, where it differs from what the job shows (by
    more than a minute, or in its basis): {job id: (start or None, basis or "")}."""
    durations = {
        job_id: history.expected(user_id=user, group_id=group, name=name, instance_type_id=itype, deadline=deadline)
        for job_id, (user, group, name, itype, deadline) in snap.kinds.items()
    }
    try:
        estimates = estimate(snap.groups, snap.queued, snap.nodes, snap.holding, durations, now, outcomes=outcomes)
    except Exception:  # an estimate is a courtesy: it must never hold back admissions
        log.exception("could not estimate the start of the waiting jobs; they keep their last estimates")
        return {}
    changes = {}
    for job_id in waiting:
        new = estimates.get(job_id)
        start, basis = (new.start, new.basis) if new else (None, "")
        old_start, old_basis = snap.estimates[job_id]
        moved = (start is None) != (old_start is None) or (
            start is not None and old_start is not None and abs(start - old_start) > ESTIMATE_SLACK)
        if moved or basis != old_basis:
            changes[job_id] = (start, basis)
    return changes


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
