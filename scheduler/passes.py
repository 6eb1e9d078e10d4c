"""One scheduling pass, in numbered steps like Kueue's ``schedule``: snapshot → decide → apply → launch → estimate.

1. Refresh: the backend's nodes and the duration history, before any lock (neither waits on the cluster).
2. Lock: every group row, in a stable order (the scheduling lock).
3. Snapshot and decide (``decide_heads``): read what the decision needs (``scheduler.snapshot``), decide on it with
   the pure core (``scheduler.core.decide``), read more of a group's queue while its head was not reached.
   A pass reuses the last pass's snapshot and decision while nothing they were made of changed (``scheduler.carry``).
4. Apply (``apply_outcomes``): admissions, preemptions and waits written through the services, under the lock.
5. After commit: the admitted jobs handed to the actuator, their waits recorded in the metrics.
6. After the lock: the waiting jobs' estimated starts (``scheduler.pass_estimates``).

Two passes never over-commit: apply holds the row locks of every group while it reads usage and admits, so a
second pass waits and then sees the first one's admissions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from jobs import services
from jobs.choices import QUEUED_PHASES, Phase
from jobs.models import Group, Job
from jobs.state_machine import InvalidTransition

from . import carry, metrics
from .actuator import get_actuator
from .backend_factory import get_backend
from .backends.base import Backend
from .core import HOLDING_REASONS, Outcome, QueuedJob, Reason, Verdict, behind_message, decide
from .pass_estimates import estimate_changes, estimated_part, memory
from .snapshot import Snapshot, snapshot


@dataclass
class PassResult:
    admitted: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    waiting: int = 0
    inadmissible: int = 0
    written: int = 0  # rows the pass wrote (admitted, preempted, moved, messages refreshed)
    carried: bool = False  # the last pass's decision reused: nothing it was made of had changed


def schedule_pass(*, backend: Backend | None = None, now: datetime | None = None) -> PassResult:
    """One pass, the steps of the module's doc in order."""
    backend = backend or get_backend()
    clock = now or timezone.now()
    # 1. Refresh: the backend answers from memory; the history costs at most one query a minute.
    refresh_nodes(backend)
    history = memory.duration_history(clock)
    with transaction.atomic():
        # 2. Lock: every group row, in a stable order; FOR NO KEY UPDATE: passes (and edits of a group) wait for
        # each other, a submit does not (its job's reference to its group takes a key-share lock on the row).
        list(Group.objects.select_for_update(no_key=True).order_by("id").values_list("id", flat=True))
        # 3. Snapshot and decide, unless nothing the last pass's decision was made of has changed (it is reused:
        # the same rows would be read, the same decided, nothing written).
        carried = carry.memory.recall(backend.name, clock)
        if carried is not None:
            result = PassResult(waiting=carried.result.waiting, inadmissible=carried.result.inadmissible, carried=True)
        else:
            snap, outcomes = decide_heads(backend, clock)
            # 4. Apply.
            result, waiting = apply_outcomes(snap, outcomes, backend=backend, now=now)
            carried = carry.memory.remember(snap, outcomes, waiting, result, clock, wrote=result.written > 0)
            # 5. After commit: launch, and the admitted jobs' waits.
            admitted = list(result.admitted)
            transaction.on_commit(lambda: launch_jobs(admitted, backend=backend))
            requests = {j.id: j for j in snap.queued}
            waited = [requests[i].queued_at for i in admitted]
            transaction.on_commit(lambda: [metrics.observe_admission(queued_at) for queued_at in waited])
    # 6. Estimates, after the scheduling lock is released: the simulation is CPU work no other pass need wait for,
    # and the write touches only jobs still pending.
    if carried.estimated is None:
        carried.estimated = estimated_part(carried.snap, carried.outcomes, carried.waiting)
    snap, outcomes, waiting = carried.estimated
    if memory.estimate_due(snap, outcomes, history, clock):
        services.job_estimate_update(estimate_changes(snap, outcomes, history, clock, waiting))
    return result


def apply_outcomes(snap: Snapshot, outcomes: list[Outcome], *, backend: Backend, now: datetime | None
                   ) -> tuple[PassResult, list[int]]:
    """Write the decision through the services, under the scheduling lock: preempt the victims, admit, move the
    others to PENDING or INADMISSIBLE with their reason (or only refresh what they show), and update what the jobs
    behind each group's head show. Returns the pass's result and the ids of the jobs left waiting. A job cancelled
    meanwhile (its row lock shows the new phase) is skipped."""
    result = PassResult()
    waiting: list[int] = []
    requests = {j.id: j for j in snap.queued}
    refreshed: dict[int, str] = {}
    behind: list[int] = []  # read jobs that now wait behind their group's head
    victims = Job.objects.in_bulk([o.job_id for o in outcomes if o.verdict == Verdict.PREEMPT])
    for outcome in outcomes:
        try:
            if outcome.verdict == Verdict.PREEMPT:
                if outcome.job_id in victims:
                    result.written += 1  # before the call: one that fails may have written
                    services.job_preempt(job=victims[outcome.job_id], by_job_id=outcome.by,
                                         message=outcome.message, now=now)
                    result.preempted.append(outcome.job_id)
                continue
            phase, reason, message, _ = snap.shown[outcome.job_id]
            if outcome.verdict == Verdict.ADMIT:
                result.written += 1
                _admit(outcome, phase, requests[outcome.job_id], backend, now)
                result.admitted.append(outcome.job_id)
                continue
            target = Phase.PENDING if outcome.verdict == Verdict.WAIT else Phase.INADMISSIBLE
            if outcome.reason == Reason.BLOCKED and phase == Phase.PENDING:
                # Not an event of its own: written with every other job behind the same head, below.
                if (reason, message) != (outcome.reason, outcome.message):
                    behind.append(outcome.job_id)
            elif (phase, reason) != (target, outcome.reason):
                result.written += 1
                services.job_transition(
                    job=Job(pk=outcome.job_id), phase=target, reason=str(outcome.reason),
                    status="Inadmissible" if target == Phase.INADMISSIBLE else None,
                    message=outcome.message, now=now, from_phases=QUEUED_PHASES,  # not one cancelled since it was read
                )
            elif message != outcome.message:
                refreshed[outcome.job_id] = outcome.message
        except InvalidTransition:  # cancelled meanwhile: its row lock showed the new phase
            continue
        if outcome.verdict == Verdict.WAIT:
            result.waiting += 1
            waiting.append(outcome.job_id)
        else:
            result.inadmissible += 1
    services.job_queue_info_update(refreshed)
    heads, moved = queue_heads_changed(snap, outcomes)
    result.written += len(refreshed) + len(behind) + len(moved)
    services.job_queue_behind_update(behind=heads, jobs=behind, groups=moved)
    return result, waiting


def decide_heads(backend: Backend, now: datetime) -> tuple[Snapshot, list[Outcome]]:
    """Snapshot and decide; while what was read of a group's queue does not reach the job that holds it (its
    first jobs were all admitted or skipped), read more of that group and decide again."""
    limits: dict[int, int] | None = None
    while True:
        snap = snapshot(backend, head_rows=limits)
        outcomes = decide(snap.groups, snap.queued, snap.nodes, snap.running, now=now, arrays=snap.arrays)
        short = short_groups(snap, outcomes)
        if not short:
            return snap, outcomes
        limits = {gid: n * 4 if gid in short else n for gid, (n, _) in snap.prefix.items()}


def short_groups(snap: Snapshot, outcomes: list[Outcome]) -> set[int]:
    """The groups of which more must be read: all of their first jobs asked for were there, and no job up to the
    last of those holds the queue (so a job not read may come before the head)."""
    jobs = {j.id: j for j in snap.queued}
    holder: dict[int, QueuedJob] = {}
    for o in outcomes:
        job = jobs.get(o.job_id)
        if job and o.verdict == Verdict.WAIT and o.reason in HOLDING_REASONS and job.group_id not in holder:
            holder[job.group_id] = job
    short = set()
    for gid, (asked, ids) in snap.prefix.items():
        if len(ids) < asked:
            continue  # its whole queue was read
        last = max(jobs[i].order_key for i in ids)
        if gid not in holder or holder[gid].order_key > last:
            short.add(gid)
    return short


def queue_heads_changed(snap: Snapshot, outcomes: list[Outcome]) -> tuple[dict[int, str], list[int]]:
    """What the jobs behind each group's head show now ({group: message}), and the groups whose head or its
    reason changed since the last pass (every job behind it shows the new one)."""
    jobs = {j.id: j for j in snap.queued}
    heads: dict[int, str] = {}
    for o in outcomes:
        job = jobs.get(o.job_id)
        if job and o.verdict == Verdict.WAIT and o.reason in HOLDING_REASONS and job.group_id not in heads:
            heads[job.group_id] = behind_message(job.id, job.name, o.reason)
    before: dict[int, str | None] = {}
    for job_id, (phase, reason, _, _) in snap.shown.items():
        if phase == Phase.PENDING and reason in HOLDING_REASONS:
            job = jobs[job_id]
            before[job.group_id] = None if job.group_id in before else behind_message(job.id, job.name, reason)
    return heads, [gid for gid, message in heads.items() if before.get(gid) != message]


def refresh_nodes(backend: Backend) -> None:
    """Record the backend's nodes in the database (the Node table), for admission and the pages. The backend
    answers from what it already knows (no cluster call here); None: it does not know yet, keep the last rows."""
    nodes = backend.nodes()
    if nodes is None:
        return
    services.nodes_record(backend=backend.name, nodes={n.name: dict(n.allocatable) for n in nodes})


def _admit(outcome: Outcome, phase: str, queued: QueuedJob, backend: Backend, now: datetime | None) -> None:
    """Admit the job as decided; ``InvalidTransition`` (nothing written) when it is no longer queued: cancelled
    after the pass read it. The job is read once, locked, for both transitions (in the pass's transaction)."""
    if phase == Phase.PENDING:
        job = services.job_locked(job_id=outcome.job_id)
    else:  # SUBMITTED or INADMISSIBLE: into the queue first, so the trail says so (the job as the transition read it)
        job = services.job_transition(job=Job(pk=outcome.job_id), phase=Phase.PENDING, reason="Queued", now=now,
                                      from_phases=QUEUED_PHASES)
    placement = [{"node": p.node, "gpu_ids": list(p.gpu_ids)} for p in outcome.placement]
    services.job_admit(job=job, backend=backend.name, placement=placement or [{"node": ""}] * queued.replicas,
                       over_quota=outcome.over_quota, nominated=queued.nominated, now=now, locked=True)


def launch_jobs(job_ids: list[int], *, backend: Backend) -> None:
    """Hand the admitted jobs to the actuator (its pool in the scheduler loop): admission never waits on them."""
    actuator = get_actuator(backend)
    for job_id in job_ids:
        actuator.launch(job_id)
