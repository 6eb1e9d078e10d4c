"""Reads of arrays and sweeps, permission-aware like ``jobs.selectors``: the arrays a user may see, their members'
counts per phase (one query for a page of arrays), their members in index order, and who may act on them."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, QuerySet

from .models import Job, JobArray, Membership
from .selectors import job_can_act

MEMBER_FIELDS = ("id", "name", "array_index", "array_params", "phase", "status", "reason")


def arrays_visible_to(user: AbstractBaseUser) -> QuerySet[JobArray]:
    """Arrays of the groups the user belongs to (all for superusers), newest first."""
    qs = JobArray.objects.select_related("group", "user").order_by("-id")
    if user.is_superuser:
        return qs
    return qs.filter(group__in=Membership.objects.filter(user=user).values("group_id"))


def array_counts(array_ids: Iterable[int]) -> dict[int, dict[str, int]]:
    """{array id: {phase: members in it}} (phases with members only), for all ``array_ids`` in one query."""
    ids = list(array_ids)
    counts: dict[int, dict[str, int]] = {i: {} for i in ids}
    if not ids:
        return counts
    rows = (Job.objects.filter(array_id__in=ids).order_by().values_list("array_id", "phase")
            .annotate(n=Count("id")))
    for array_id, phase, n in rows:
        counts[array_id][phase] = n
    return counts


def array_members(array: JobArray) -> list[dict]:
    """The members of ``array`` in index order, as ``MEMBER_FIELDS`` dicts: one query."""
    return list(Job.objects.filter(array=array).order_by("array_index", "id").values(*MEMBER_FIELDS))


def array_can_act(user: AbstractBaseUser, array: JobArray) -> bool:
    """The rule of a single job (``selectors.job_can_act``): every member has the array's user and group, so who
    may act on one member may act on all of them."""
    return job_can_act(user, array)
