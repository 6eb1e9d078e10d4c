"""Dependencies between jobs (``after: [{job: 12, when: ok}]``): checked at submit (``after_problems``), recorded
with the jobs they hold back (``dependencies_record``), and met or made impossible when the jobs they wait for end
(``dependents_on_end``, called by ``job_transition`` in its transaction).

A job with an unmet dependency waits PENDING with reason Dependency and ``dependency_wait`` set: the scheduler's
snapshot leaves it out of its group's queue, so it holds nobody back. When the last one is met it goes back into
the queue (reason Queued, a pass requested after commit); when one can never be met it ends CANCELLED with reason
DependencyNeverSatisfied, which in turn settles what waits for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from .. import selectors
from ..choices import QUEUED_PHASES, EventType, Phase
from ..dependencies import (
    After,
    AfterInvalid,
    State,
    after_parse,
    dependency_state,
    find_cycle,
    never_event_message,
    never_message,
    target_label,
    waits_message,
)
from ..models import Job, JobArray, JobDependency
from ..prepared import Prepared
from ..wakeup import request_pass

Target = tuple[str, int]  # ("job", 12) or ("array", 5)
NEVER_REASON = "DependencyNeverSatisfied"
CYCLE_DEPTH_MAX = 1000  # levels of dependencies followed when looking for a cycle


def _target_phases(after: Sequence[After], *, user: AbstractBaseUser, lock: bool) -> dict[Target, list[str]]:
    """The phases of what ``after`` waits for that ``user`` may see: a job's own, every member's of an array.
    ``lock``: their rows are locked (members too), so none of them ends unseen while the dependencies are being
    recorded (its end then waits for this transaction and finds them)."""
    job_ids = sorted(a.id for a in after if a.kind == "job")
    array_ids = sorted(a.id for a in after if a.kind == "array")
    found: dict[Target, list[str]] = {}
    if job_ids:
        jobs = selectors.jobs_visible_to(user).filter(pk__in=job_ids).order_by("pk")
        if lock:
            jobs = jobs.select_for_update(of=("self",))
        for pk, phase in jobs.values_list("pk", "phase"):
            found[("job", pk)] = [phase]
    if array_ids:
        arrays = JobArray.objects.filter(pk__in=array_ids)
        if not user.is_superuser:
            arrays = arrays.filter(group__in=selectors.groups_of(user))
        visible = list(arrays.values_list("pk", flat=True))
        for pk in visible:
            found[("array", pk)] = []
        members = Job.objects.filter(array_id__in=visible).order_by("pk")
        if lock:
            members = members.select_for_update(of=("self",))
        for array_id, phase in members.values_list("array_id", "phase"):
            found[("array", array_id)].append(phase)
    return found


def _cycle(after: Sequence[After], new_jobs: Sequence[Job] = ()) -> list[Target] | None:
    """A cycle the dependencies would close, following what the targets themselves still wait for (a job: its
    unmet dependencies; an array: those of its members). ``new_jobs`` wait for ``after``; nodes ("new", 0) stand
    for the submission when it has no jobs yet. One query per level of the graph."""
    graph: dict[Target, set[Target]] = {}
    sources = [("job", j.pk) for j in new_jobs] or [("new", 0)]
    for source in sources:
        graph[source] = {a.target for a in after}
    for array_id in {j.array_id for j in new_jobs if j.array_id}:
        graph.setdefault(("array", array_id), set()).update(a.target for a in after)
    frontier = {t for a in after for t in [a.target] if t not in graph}
    for _ in range(CYCLE_DEPTH_MAX):
        if not frontier:
            break
        for node in frontier:
            graph.setdefault(node, set())
        job_ids = [i for k, i in frontier if k == "job"]
        array_ids = [i for k, i in frontier if k == "array"]
        rows = (JobDependency.objects.filter(satisfied_at__isnull=True)
                .filter(Q(job_id__in=job_ids) | Q(job__array_id__in=array_ids))
                .values_list("job_id", "job__array_id", "on_job_id", "on_array_id"))
        found: set[Target] = set()
        for job_id, array_id, on_job_id, on_array_id in rows:
            target = ("job", on_job_id) if on_job_id else ("array", on_array_id)
            if job_id in job_ids:
                graph[("job", job_id)].add(target)
            if array_id in array_ids:
                graph[("array", array_id)].add(target)
            found.add(target)
        frontier = found - graph.keys()
    return find_cycle(graph)


def _cycle_message(cycle: list[Target]) -> str:
    names = ["this job" if kind == "new" else target_label(kind, pk) for kind, pk in cycle]
    return "These dependencies would make a cycle: " + " waits for ".join(names) + "."


def after_problems(*, user: AbstractBaseUser, value: Any) -> tuple[tuple[After, ...], list[str]]:
    """``value`` (a submission's ``after``) read and checked for ``user``: its dependencies, and the messages of
    the ``after`` field (empty when it may be recorded): a target that does not exist or is not visible to the
    user, one that has already ended the other way, a cycle. Reads only."""
    try:
        after = after_parse(value)
    except AfterInvalid as exc:
        return (), [str(exc)]
    if not after:
        return (), []
    problems = _problems(after, _target_phases(after, user=user, lock=False))
    if not problems:
        cycle = _cycle(after)
        if cycle:
            problems.append(_cycle_message(cycle))
    return after, problems


def _problems(after: Sequence[After], phases: dict[Target, list[str]]) -> list[str]:
    problems = []
    for a in after:
        if a.target not in phases:
            problems.append(f"There is no {target_label(*a.target)} that you can see.")
        elif dependency_state(a.when, phases[a.target]) == State.NEVER:
            problems.append(never_message(a.kind, a.id, a.when, phases[a.target]) + ".")
    return problems


@transaction.atomic
def dependencies_record(*, jobs: Sequence[Job], after: Iterable[After] | Any, user: AbstractBaseUser,
                        now: datetime | None = None) -> list[JobDependency]:
    """Record that each of ``jobs`` (just created, SUBMITTED) waits for ``after`` (checked by ``after_problems``;
    raw dicts are read here). Dependencies already met are recorded met; a job with one not met yet moves to
    PENDING with reason Dependency, a message naming what it waits for and ``dependency_wait`` set.

    The targets' rows are locked first, so a target ending meanwhile either finished before (and is seen ended
    here) or waits for this commit (and finds these rows). Raises ``ValidationError`` on the ``after`` field when
    a target vanished or ended the other way since the check, or a cycle would form: the caller's transaction
    then writes nothing."""
    after = tuple(after or ())
    if after and not all(isinstance(a, After) for a in after):
        try:
            after = after_parse(list(after))
        except AfterInvalid as exc:
            raise ValidationError({"after": [str(exc)]}) from exc
    jobs = list(jobs)
    if not after or not jobs:
        return []
    now = now or timezone.now()
    phases = _target_phases(after, user=user, lock=True)
    problems = _problems(after, phases)
    cycle = None if problems else _cycle(after, jobs)
    if cycle:
        problems.append(_cycle_message(cycle))
    if problems:
        raise ValidationError({"after": problems})
    states = {a.target: dependency_state(a.when, phases[a.target]) for a in after}
    rows = [
        JobDependency(job=job, on_job_id=a.id if a.kind == "job" else None,
                      on_array_id=a.id if a.kind == "array" else None, when=a.when,
                      satisfied_at=now if states[a.target] == State.MET else None)
        for job in jobs for a in after
    ]
    JobDependency.objects.bulk_create(rows)
    waits = [(a.kind, a.id, a.when) for a in after if states[a.target] == State.WAITING]
    if waits:
        from .transitions import job_transition  # transitions imports this module for its hook

        message = waits_message(waits)
        for job in jobs:
            job_transition(job=job, phase=Phase.PENDING, reason="Dependency", message=message,
                           dependency_wait=True, now=now)
    return rows


# What waits for an ending job (and for its array): read by every job's end, compiled once.
UNMET_ON_JOB = Prepared(lambda job_id: JobDependency.objects.filter(on_job_id=job_id, satisfied_at__isnull=True)
                        .order_by("job_id", "pk"), job_id=int)
UNMET_ON_MEMBER = Prepared(lambda job_id, array_id: JobDependency.objects.filter(
    Q(on_job_id=job_id) | Q(on_array_id=array_id), satisfied_at__isnull=True).order_by("job_id", "pk"),
    job_id=int, array_id=int)


def dependents_on_end(*, job: Job, now: datetime) -> None:
    """``job`` has just ended (inside its transition's transaction): settle what waits for it. Every unmet
    dependency on it, or on its array once every member of the array has ended, is met (the waiting job goes back
    into its queue when nothing else holds it) or can never be (the waiting job ends DependencyNeverSatisfied).
    One query finds them; none of the rest runs when nothing waits."""
    unmet = (UNMET_ON_MEMBER.all(job_id=job.pk, array_id=job.array_id) if job.array_id
             else UNMET_ON_JOB.all(job_id=job.pk))
    if not unmet:
        return
    members: list[str] = []
    if any(d.on_array_id for d in unmet):
        # Members ending at once take turns here: the last one to take the lock sees every member ended.
        list(JobArray.objects.select_for_update().filter(pk=job.array_id).values_list("pk", flat=True))
        members = list(Job.objects.filter(array_id=job.array_id).values_list("phase", flat=True))
    for dep in unmet:
        kind, target_id = ("job", job.pk) if dep.on_job_id else ("array", job.array_id)
        phases = [job.phase] if dep.on_job_id else members
        state = dependency_state(dep.when, phases)
        if state == State.MET:
            _met(dep, kind, target_id, phases, now)
        elif state == State.NEVER:
            _never(dep, kind, target_id, phases, now)


def _locked_waiting(dep: JobDependency) -> Job:
    return Job.objects.select_for_update(of=("self",)).get(pk=dep.job_id)


def _met(dep: JobDependency, kind: str, target_id: int, phases: list[str], now: datetime) -> None:
    from .transitions import job_transition

    if not JobDependency.objects.filter(pk=dep.pk, satisfied_at__isnull=True).update(satisfied_at=now):
        return  # settled by another end meanwhile
    waiting = _locked_waiting(dep)
    if not waiting.dependency_wait:
        return
    left = list(JobDependency.objects.filter(job_id=waiting.pk, satisfied_at__isnull=True).order_by("pk")
                .values_list("on_job_id", "on_array_id", "when"))
    if waiting.phase not in (*QUEUED_PHASES, Phase.BACKOFF):
        if not left:  # ended meanwhile (cancelled while waiting): a restart queues it
            Job.objects.filter(pk=waiting.pk).update(dependency_wait=False)
        return
    if left:  # still held by others: say which
        job_transition(job=waiting, phase=Phase.PENDING, reason="Dependency", now=now,
                       message=waits_message(("job", j, w) if j else ("array", a, w) for j, a, w in left))
        return
    ended = "succeeded" if all(p == Phase.SUCCEEDED for p in phases) else "ended"
    job_transition(job=waiting, phase=Phase.PENDING, reason="Queued", dependency_wait=False, now=now,
                   message=f"Dependencies met: {target_label(kind, target_id)} {ended}")
    transaction.on_commit(request_pass, robust=True)  # back in the queue: a pass admits it


def _never(dep: JobDependency, kind: str, target_id: int, phases: list[str], now: datetime) -> None:
    from .transitions import job_transition

    waiting = _locked_waiting(dep)
    if waiting.phase not in (*QUEUED_PHASES, Phase.BACKOFF):
        if waiting.dependency_wait:  # ended meanwhile: a restart is the user's decision to run it anyway
            Job.objects.filter(pk=waiting.pk).update(dependency_wait=False)
        return
    job_transition(job=waiting, phase=Phase.CANCELLED, status="Cancelled", reason=NEVER_REASON,
                   event_type=EventType.WARNING, dependency_wait=False, now=now,
                   message=never_event_message(kind, target_id, dep.when, phases))
    transaction.on_commit(request_pass, robust=True)
