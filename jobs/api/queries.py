"""Reads the API needs beyond ``jobs.selectors``: a page of groups with quotas and usage in a fixed number of
queries, and the sizes of an attempt's replica logs."""

from __future__ import annotations

from collections.abc import Sequence

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count

from jobs import logs, selectors
from jobs.choices import QUEUED_PHASES, RESOURCE_PHASES, Resource
from jobs.models import Attempt, Group, GroupQuota, Job, Membership, slug_validator


def visible_group(user: AbstractBaseUser, name: str) -> Group | None:
    """The group called ``name`` if ``user`` may see it (a member, or a superuser); None otherwise."""
    if not name or len(name) > 63 or not slug_validator.regex.match(name):
        return None
    return selectors.groups_of(user).filter(name=name).first()


def _zero() -> dict[str, int]:
    return {r: 0 for r in Resource.values}


def groups_overview(user: AbstractBaseUser, groups: Sequence[Group]) -> dict[int, dict]:
    """Per group: the user's role, quotas with usage, what the group and the user hold, running/queued counts."""
    ids = [g.pk for g in groups]
    if not ids:
        return {}
    usage = selectors.group_usage(groups)
    mine = {gid: _zero() for gid in ids}
    for row in (
        Job.objects.filter(group_id__in=ids, user=user, phase__in=RESOURCE_PHASES)
        .values("group_id")
        .annotate(**selectors.held_resources())
    ):
        mine[row["group_id"]] = {r: row[r] or 0 for r in Resource.values}
    counts = {gid: {"running": 0, "queued": 0} for gid in ids}
    for row in (
        Job.objects.filter(group_id__in=ids, phase__in=RESOURCE_PHASES | QUEUED_PHASES)
        .values("group_id", "phase")
        .annotate(n=Count("id"))
    ):
        kind = "running" if row["phase"] in RESOURCE_PHASES else "queued"
        counts[row["group_id"]][kind] += row["n"]
    roles = dict(Membership.objects.filter(user=user, group_id__in=ids).values_list("group_id", "role"))
    quotas: dict[int, list[dict]] = {gid: [] for gid in ids}
    for q in GroupQuota.objects.filter(group_id__in=ids).order_by("group_id", "resource"):
        quotas[q.group_id].append({
            "resource": q.resource, "quota": q.quota, "limit": q.limit, "user_quota": q.user_quota,
            "used": usage[q.group_id].get(q.resource, 0), "used_by_me": mine[q.group_id].get(q.resource, 0),
        })
    return {
        gid: {
            "role": roles.get(gid),
            "quotas": quotas[gid],
            "usage": usage[gid],
            "my_usage": mine[gid],
            "running_jobs": counts[gid]["running"],
            "queued_jobs": counts[gid]["queued"],
        }
        for gid in ids
    }


def attempt_logs(attempt: Attempt) -> list[dict]:
    """Each replica of an attempt with the size of its log in bytes (None: no log yet, or not kept here)."""
    out = []
    for rank in range(attempt.replicas):
        path = logs.log_path(attempt, rank)
        try:
            size = path.stat().st_size if path is not None else None
        except OSError:
            size = None
        out.append({"replica": rank, "size": size})
    return out
