"""What a job's page and its API detail show of its dependencies: what it waits for, and which jobs the viewer may
see wait for it (or for its array). One query for both."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q

from .choices import DependencyWhen
from .dependencies import waiting_for
from .models import Job, JobDependency, Membership


@dataclass(frozen=True)
class WaitsFor:
    """One dependency of the job: the job or array (``kind``, ``id``) and when it is met."""

    kind: str
    id: int
    when: str
    satisfied: bool

    @property
    def words(self) -> str:
        return waiting_for(self.kind, self.id, self.when)

    @property
    def condition(self) -> str:
        return DependencyWhen(self.when).label.lower()


@dataclass(frozen=True)
class WaitedOnBy:
    """A job that waits for this one (``via_array``: for the whole array this job belongs to)."""

    id: int
    name: str
    phase: str
    when: str
    satisfied: bool
    via_array: bool

    @property
    def condition(self) -> str:
        return DependencyWhen(self.when).label.lower()


@dataclass
class JobDependencies:
    after: list[WaitsFor] = field(default_factory=list)
    waited_by: list[WaitedOnBy] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.after or self.waited_by)


def job_dependencies(job: Job, viewer: AbstractBaseUser | None) -> JobDependencies:
    """What ``job`` waits for and the jobs ``viewer`` may see (same rule as reading a job) that wait for it or for
    its array, oldest first (none without a viewer). One query."""
    waited = Q(on_job_id=job.pk)
    if job.array_id:
        waited |= Q(on_array_id=job.array_id)
    if viewer is None:  # nobody to show other jobs to: what it waits for only
        waited = Q(pk__in=[])
    elif not viewer.is_superuser:
        waited &= Q(job__group_id__in=Membership.objects.filter(user=viewer).values("group_id"))
    rows = (JobDependency.objects.filter(Q(job_id=job.pk) | waited).order_by("pk")
            .values_list("job_id", "job__name", "job__phase", "on_job_id", "on_array_id", "when", "satisfied_at"))
    found = JobDependencies()
    for job_id, name, phase, on_job_id, on_array_id, when, satisfied_at in rows:
        if job_id == job.pk:
            kind, target = ("job", on_job_id) if on_job_id else ("array", on_array_id)
            found.after.append(WaitsFor(kind, target, when, satisfied_at is not None))
        else:
            found.waited_by.append(WaitedOnBy(job_id, name, phase, when, satisfied_at is not None,
                                              via_array=on_job_id != job.pk))
    return found


def dependencies_in_hand(rows: list[JobDependency]) -> JobDependencies:
    """What a job just submitted waits for, from the rows its submit recorded (``Job.dependencies_recorded``):
    its answer reads nothing back, and nothing can wait for it yet."""
    return JobDependencies(after=[
        WaitsFor("job" if d.on_job_id else "array", d.on_job_id or d.on_array_id, d.when, d.satisfied_at is not None)
        for d in rows
    ])
