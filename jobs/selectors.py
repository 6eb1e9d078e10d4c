"""Reads of the jobs app, permission-aware. Views and API views list and fetch through these."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import F, QuerySet, Sum

from .choices import RESOURCE_PHASES, Resource, Role
from .models import Group, GroupQuota, Image, InstanceType, Job, JobEvent, Membership


def groups_of(user: AbstractBaseUser) -> QuerySet[Group]:
    if user.is_superuser:
        return Group.objects.all()
    return Group.objects.filter(memberships__user=user)


def jobs_visible_to(user: AbstractBaseUser) -> QuerySet[Job]:
    """Jobs of the groups the user belongs to (all jobs for superusers), newest first."""
    qs = Job.objects.select_related("group", "user", "image", "instance_type", "current_attempt")
    if user.is_superuser:
        return qs
    return qs.filter(group__in=Membership.objects.filter(user=user).values("group_id"))


def job_can_act(user: AbstractBaseUser, job: Job) -> bool:
    """Own jobs; every job of a group the user administers; everything for superusers."""
    if user.is_superuser or job.user_id == user.pk:
        return True
    return Membership.objects.filter(user=user, group_id=job.group_id, role=Role.ADMIN).exists()


def job_events(job: Job) -> QuerySet[JobEvent]:
    return job.events.select_related("attempt").order_by("id")


def images_for(group: Group | None) -> QuerySet[Image]:
    return Image.objects.filter(groups=group) if group else Image.objects.none()


def instance_types_for(group: Group | None) -> QuerySet[InstanceType]:
    return InstanceType.objects.filter(groups=group) if group else InstanceType.objects.none()


def group_usage(groups: Iterable[Group]) -> dict[int, dict[str, int]]:
    """Resources held right now by each group's jobs: {group_id: {gpu, cpu, memory}}."""
    ids = [g.pk for g in groups]
    usage = {gid: {r: 0 for r in Resource.values} for gid in ids}
    rows = (
        Job.objects.filter(group_id__in=ids, phase__in=RESOURCE_PHASES)
        .values("group_id")
        .annotate(
            gpu=Sum(F("gpu") * F("replicas")),
            cpu=Sum(F("cpu_millicores") * F("replicas")),
            memory=Sum(F("memory_bytes") * F("replicas")),
        )
    )
    for row in rows:
        usage[row["group_id"]] = {r: row[r] or 0 for r in Resource.values}
    return usage


def quota_rows(group: Group) -> list[dict]:
    """Each quota of a group with its current usage, for admin and the UI."""
    usage = group_usage([group])[group.pk]
    return [
        {"resource": q.resource, "quota": q.quota, "limit": q.limit, "user_quota": q.user_quota,
         "used": usage.get(q.resource, 0)}
        for q in GroupQuota.objects.filter(group=group)
    ]
