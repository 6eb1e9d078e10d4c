"""Reads of the jobs app, permission-aware. Views and API views list and fetch through these."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.paginator import EmptyPage, Page, PageNotAnInteger, Paginator
from django.db import connections
from django.db.models import Count, F, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone
from django.utils.functional import cached_property

from .choices import QUEUED_PHASES, RESOURCE_PHASES, Resource, Role
from .filtersets import JobFilterSet
from .models import Attempt, Group, GroupQuota, Image, InstanceType, Job, JobEvent, Membership, Node
from .prepared import in_parts

# The job list counts exactly up to this many jobs, and estimates above (setting JOBSITE_LIST_EXACT_COUNT_MAX).
LIST_EXACT_COUNT_MAX = 10_000
# An estimate this many times the threshold is taken as it is, without the bounded count that would confirm it.
ESTIMATE_TRUSTED_ABOVE = 10


def groups_of(user: AbstractBaseUser) -> QuerySet[Group]:
    if user.is_superuser:
        return Group.objects.all()
    return Group.objects.filter(memberships__user=user)


def jobs_visible_to(user: AbstractBaseUser, *, group_ids: list[int] | None = None) -> QuerySet[Job]:
    """Jobs of the groups the user belongs to (all jobs for superusers), newest first. ``group_ids``: those groups,
    when the caller has read them already."""
    qs = Job.objects.select_related("group", "user", "image", "instance_type", "current_attempt")
    if user.is_superuser:
        return qs
    if group_ids is not None:
        return qs.filter(group_id__in=group_ids)
    return qs.filter(group__in=Membership.objects.filter(user=user).values("group_id"))


def job_list(user: AbstractBaseUser, params: Mapping[str, Any] | None, *, group_ids: list[int] | None = None,
             collapse_arrays: bool = False) -> tuple[QuerySet[Job], dict]:
    """The job list of the API and of the HTML page: the jobs ``user`` may see that match the list's filters
    (``jobs.filtersets.JobFilterSet``: group, user, phase, status, job type, dates, ``q`` name or id search),
    newest first; and the errors of the filters that were not understood (those filters are left out).
    ``group_ids``: the user's groups, when the caller has read them already. ``collapse_arrays`` (the HTML page):
    an array's members make one row, at its first member's place (``jobs.list_arrays``)."""
    if user.is_superuser:
        visible = jobs_visible_to(user)
    else:
        # The user's groups as values, not a subquery: the planner then knows which groups, and walks the
        # (group, phase, id) index newest first instead of the whole table when a filter matches few of their jobs.
        if group_ids is None:
            group_ids = list(Membership.objects.filter(user=user).values_list("group_id", flat=True))
        visible = jobs_visible_to(user, group_ids=group_ids)
    filterset = JobFilterSet(params or None, queryset=visible)
    jobs = filterset.qs.order_by("-id")
    if collapse_arrays:
        from .list_arrays import collapse_members

        jobs = collapse_members(jobs)
    return jobs, (filterset.errors if filterset.is_bound else {})


def job_count(jobs: QuerySet[Job]) -> tuple[int, bool]:
    """How many rows ``jobs`` has, and whether that is exact. Up to ``JOBSITE_LIST_EXACT_COUNT_MAX`` (10,000) the
    count is exact and reads at most that many index entries; above it, on PostgreSQL, it is the planner's estimate
    (the table's statistics for the unfiltered list, ``EXPLAIN`` otherwise), never below the threshold. The
    estimate is read first: one of more than ``ESTIMATE_TRUSTED_ABOVE`` times the threshold is answered without
    counting (a bounded count of a search over many jobs reads all their index entries first)."""
    limit = getattr(settings, "JOBSITE_LIST_EXACT_COUNT_MAX", LIST_EXACT_COUNT_MAX)
    narrow = jobs.order_by().values("pk")
    if connections[jobs.db].vendor != "postgresql":
        return narrow.count(), True  # no planner estimate to read; small databases count fast enough
    estimate = _estimated_rows(narrow)
    if estimate > ESTIMATE_TRUSTED_ABOVE * limit:
        return estimate, False  # far above the threshold: not worth reading threshold + 1 rows to be sure
    counted = narrow[: limit + 1].count()
    if counted <= limit:
        return counted, True
    return max(estimate, limit + 1), False


def _estimated_rows(narrow: QuerySet) -> int:
    with connections[narrow.db].cursor() as cursor:
        if not narrow.query.where:
            cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", [Job._meta.db_table])
            row = cursor.fetchone()
            if row and row[0] >= 0:  # -1: never analysed
                return int(row[0])
        sql, params = narrow.query.sql_with_params()
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


class JobPaginator(Paginator):
    """Django's paginator with ``job_count``'s count: ``count_exact`` says whether ``count`` (and so the number of
    pages) is exact or an estimate. With an estimate, pages are not cut to it: any page number may be asked for, a
    page past the end is empty (``EmptyPage``), and a full page has a next one."""

    count_exact = True

    @cached_property
    def count(self) -> int:
        count, self.count_exact = job_count(self.object_list)
        return count

    def validate_number(self, number) -> int:
        try:
            if isinstance(number, float) and not number.is_integer():
                raise ValueError
            number = int(number)
        except (TypeError, ValueError):
            raise PageNotAnInteger("That page number is not an integer") from None
        if number == 1:
            return 1  # the first page always exists (maybe empty), and is read before anything is counted
        if not self.count or self.count_exact:  # (reading count sets count_exact)
            return super().validate_number(number)
        if number < 1:
            raise EmptyPage("That page number is less than 1")
        return number

    def page(self, number) -> Page:
        number = self.validate_number(number)
        if number == 1 and "count" not in self.__dict__:
            rows = list(self.object_list[: self.per_page + 1])
            if len(rows) <= self.per_page:  # the whole list: counted as it is read
                self.__dict__["count"], self.count_exact = len(rows), True
                return self._get_page(rows, 1, self)
            if self.count and self.count_exact:  # (reading count sets count_exact)
                return self._get_page(rows[: self.per_page], 1, self)
            page = EstimatedPage(rows[: self.per_page], 1, self)
            page.more = True
            return page
        if self.count_exact:
            return super().page(number)
        rows = list(self.object_list[(number - 1) * self.per_page:number * self.per_page + 1])  # one more: a next?
        if number > 1 and not rows:
            raise EmptyPage("That page contains no results")
        page = EstimatedPage(rows[: self.per_page], number, self)
        page.more = len(rows) > self.per_page
        return page


class EstimatedPage(Page):
    """A page of a list whose count is an estimate: whether a next page exists was read with it."""

    more = False

    def has_next(self) -> bool:
        return self.more

    def end_index(self) -> int:
        return (self.number - 1) * self.paginator.per_page + len(self.object_list)


def job_can_act(user: AbstractBaseUser, job: Job) -> bool:
    """Own jobs; every job of a group the user administers; everything for superusers."""
    if user.is_superuser or job.user_id == user.pk:
        return True
    return Membership.objects.filter(user=user, group_id=job.group_id, role=Role.ADMIN).exists()


def job_spec_of(job: Job) -> dict:
    """The submission that reproduces ``job`` (clone): names, not ids, as a client would send it."""
    return {
        "name": job.name,
        "group": job.group.name,
        "image": job.image.name,
        "instance_type": job.instance_type.name,
        "command": job.command,
        "env": dict(job.env or {}),
        "replicas": job.replicas,
        "job_type": job.job_type,
        "priority": job.priority,
        "preemptible": job.preemptible,
        "backoff_limit": job.backoff_limit,
        "active_deadline_seconds": job.active_deadline_seconds,
        "ttl_seconds_after_finished": job.ttl_seconds_after_finished,
        "ports": list(job.ports or []),
    }


def job_events(job: Job) -> QuerySet[JobEvent]:
    return job.events.select_related("attempt").order_by("id")


def images_for(group: Group | None) -> QuerySet[Image]:
    return Image.objects.filter(groups=group) if group else Image.objects.none()


def instance_types_for(group: Group | None) -> QuerySet[InstanceType]:
    return InstanceType.objects.filter(groups=group) if group else InstanceType.objects.none()


def held_resources() -> dict[str, Sum]:
    """Aggregates of what jobs hold (request × replicas), to annotate a values() query with gpu, cpu, memory."""
    return {
        "gpu": Sum(F("gpu") * F("replicas")),
        "cpu": Sum(F("cpu_millicores") * F("replicas")),
        "memory": Sum(F("memory_bytes") * F("replicas")),
    }


def group_usage(groups: Iterable[Group]) -> dict[int, dict[str, int]]:
    """Resources held right now by each group's jobs: {group_id: {gpu, cpu, memory}}."""
    ids = [g.pk for g in groups]
    usage = {gid: {r: 0 for r in Resource.values} for gid in ids}
    rows = (
        Job.objects.filter(group_id__in=ids, phase__in=RESOURCE_PHASES)
        .values("group_id")
        .annotate(**held_resources())
    )
    for row in rows:
        usage[row["group_id"]] = {r: row[r] or 0 for r in Resource.values}
    return usage


def quota_rows(group: Group, *, every_resource: bool = False) -> list[dict]:
    """Each quota of a group with its current usage, for admin and the UI. ``every_resource``: also the
    resources without a quota row (quota, limit and user quota None: unlimited), in GPU, CPU, memory order."""
    usage = group_usage([group])[group.pk]
    rows = {
        q.resource: {"resource": q.resource, "quota": q.quota, "limit": q.limit, "user_quota": q.user_quota,
                     "used": usage.get(q.resource, 0)}
        for q in GroupQuota.objects.filter(group=group)
    }
    if not every_resource:
        return list(rows.values())
    return [rows.get(r) or {"resource": r, "quota": None, "limit": None, "user_quota": None, "used": usage.get(r, 0)}
            for r in Resource.values]


# --- queues, utilisation, usage -----------------------------------------------------------------------------


class QueueQuerySet(QuerySet):
    """Jobs whose ``queue_position`` is derived as their rows are fetched (one more query per page fetched)."""

    def _fetch_all(self) -> None:
        fresh = self._result_cache is None
        super()._fetch_all()
        if fresh and self._result_cache and isinstance(self._result_cache[0], Job):
            with_queue_positions(self._result_cache)


def group_queue(group: Group) -> QuerySet[Job]:
    """The jobs waiting in a group's queue, in queue order (priority, then submission time), each with its
    derived ``queue_position``."""
    return (
        QueueQuerySet(Job).filter(group=group, phase__in=QUEUED_PHASES)
        .select_related("user", "instance_type")
        .order_by("-priority", "queued_at", "id")
    )


# The scheduler's queue order among the waiting (PENDING) jobs of a group: a nominated job (reason Preempting) first,
# then priority, then queued time (scheduler.core decides in this order).
QUEUE_ORDER_SQL = ("CASE WHEN j.reason = 'Preempting' THEN 0 ELSE 1 END, j.priority DESC, j.queued_at, j.id")


def queue_positions(job_ids: Iterable[int]) -> dict[int, int]:
    """The queue position (1..n in its group, among the queued jobs: not those waiting on a dependency) of each of
    ``job_ids`` that is PENDING:
    {job id: position}. Derived when read, in one query (a window function over the queue order of those jobs'
    groups), so a scheduling pass never rewrites positions when the jobs ahead move."""
    return dict(in_parts(sorted({int(i) for i in job_ids}), _positions))  # a batch of 50,000 names them in parts


def _positions(ids: list[int]) -> list[tuple[int, int]]:
    table = Job._meta.db_table
    marks = ", ".join(["%s"] * len(ids))
    sql = (
        f"SELECT r.id, r.position FROM (SELECT j.id, ROW_NUMBER() OVER (PARTITION BY j.group_id ORDER BY "
        f"{QUEUE_ORDER_SQL}) AS position FROM {table} j WHERE j.phase = %s AND NOT j.dependency_wait AND j.group_id IN "
        f"(SELECT k.group_id FROM {table} k WHERE k.id IN ({marks}) AND k.phase = %s)) r WHERE r.id IN ({marks})"
    )
    with connections[Job.objects.db].cursor() as cursor:
        cursor.execute(sql, ["PENDING", *ids, "PENDING", *ids])
        return cursor.fetchall()


def with_queue_positions(jobs: Iterable[Job]) -> list[Job]:
    """``jobs`` with ``queue_position`` set to their derived position (None unless PENDING), for the pages and
    serializers that show it: one query for all of them."""
    jobs = list(jobs)
    positions = queue_positions(j.pk for j in jobs if j.phase == "PENDING")
    for job in jobs:
        job.queue_position = positions.get(job.pk)
    return jobs


def group_user_usage(group: Group) -> list[dict]:
    """Resources each user holds in a group right now, with the per-user quotas, busiest first."""
    quotas = {q.resource: q.user_quota for q in GroupQuota.objects.filter(group=group)}
    rows = (
        Job.objects.filter(group=group, phase__in=RESOURCE_PHASES)
        .values("user__username")
        .annotate(**held_resources(), jobs=Count("id"))
        .order_by("-gpu", "user__username")
    )
    return [
        {"user": r["user__username"], "jobs": r["jobs"],
         "used": {res: r[res] or 0 for res in Resource.values}, "user_quota": quotas}
        for r in rows
    ]


@dataclass
class NodeUsage:
    """A node's allocatable resources and what is free of them once the attempts placed on it are counted."""

    name: str
    allocatable: dict[str, int]
    free: dict[str, int]
    free_gpu_ids: list[int] | None = None
    updated_at: datetime | None = None

    @property
    def gpu_total(self) -> int:
        return self.allocatable.get("gpu", 0)

    @property
    def gpu_used(self) -> int:
        return self.gpu_total - self.free.get("gpu", 0)

    @property
    def gpu_free(self) -> int:
        return self.gpu_total - self.gpu_used


def nodes_with_usage(backend: str) -> list[NodeUsage]:
    """The nodes the scheduler last read from ``backend`` (the Node table), minus what the attempts holding
    resources have placed on them. Database only: works while the cluster's API is down."""
    nodes = [NodeUsage(n.name, dict(n.allocatable), dict(n.allocatable), None, n.updated_at)
             for n in Node.objects.filter(backend=backend)]
    if not nodes:
        return nodes
    by_name = {n.name: n for n in nodes}
    busy_ids: dict[str, set[int]] = defaultdict(set)
    holding = Attempt.objects.filter(job__phase__in=RESOURCE_PHASES, job__current_attempt=F("pk"), backend=backend)
    for a in holding.select_related("job").only("placement", "job__cpu_millicores", "job__memory_bytes", "gpu"):
        for p in a.placement.values():
            node = by_name.get(p.get("node", ""))
            if node is None:
                continue
            request = {"gpu": a.gpu, "cpu": a.job.cpu_millicores, "memory": a.job.memory_bytes}
            for r in node.free:
                node.free[r] -= request.get(r, 0)
            busy_ids[node.name].update(p.get("gpu_ids", []))
    for n in nodes:
        if "gpu" in n.allocatable:
            n.free_gpu_ids = [i for i in range(n.allocatable["gpu"]) if i not in busy_ids[n.name]]
    return nodes


def sees_group_detail(user: AbstractBaseUser) -> set[int] | None:
    """The groups whose users and jobs ``user`` may see on the utilisation pages: their own groups; None (every
    group) for staff and superusers. Other groups show in aggregate only."""
    if user.is_staff or user.is_superuser:
        return None
    return set(Membership.objects.filter(user=user).values_list("group_id", flat=True))


def cluster_utilisation(viewer: AbstractBaseUser) -> dict:
    """Nodes with their GPUs; every group in aggregate (running / queued jobs and GPUs, GPU quota); and running /
    queued jobs and GPUs by user (like `mcli util`) in the groups whose detail ``viewer`` may see
    (``sees_group_detail``): no other group's user names reach the page."""
    nodes = nodes_with_usage(settings.JOBSITE_BACKEND)
    detail = sees_group_detail(viewer)
    by_user: dict[str, dict] = {}
    by_group: dict[int, dict] = {}
    for row in (
        Job.objects.filter(phase__in=RESOURCE_PHASES | QUEUED_PHASES)
        .values("group_id", "group__name", "user__username", "phase")
        .annotate(jobs=Count("id"), gpu=Sum(F("gpu") * F("replicas")))
    ):
        kind = "running" if row["phase"] in RESOURCE_PHASES else "queued"
        group = by_group.setdefault(row["group_id"], {
            "group": row["group__name"], "member": detail is None or row["group_id"] in detail, "gpu_quota": None,
            "running": 0, "running_gpu": 0, "queued": 0, "queued_gpu": 0})
        group[kind] += row["jobs"]
        group[f"{kind}_gpu"] += row["gpu"] or 0
        if not group["member"]:
            continue
        entry = by_user.setdefault(row["user__username"], {"user": row["user__username"], "running": 0,
                                                           "running_gpu": 0, "queued": 0, "queued_gpu": 0})
        entry[kind] += row["jobs"]
        entry[f"{kind}_gpu"] += row["gpu"] or 0
    for group_id, quota in GroupQuota.objects.filter(group_id__in=by_group, resource=Resource.GPU).values_list(
            "group_id", "quota"):
        by_group[group_id]["gpu_quota"] = quota
    total = sum(n.gpu_total for n in nodes)
    used = sum(n.gpu_used for n in nodes)
    return {
        "nodes": nodes,
        "gpu_total": total,
        "gpu_used": used,
        "gpu_free": total - used,
        "groups": sorted(by_group.values(), key=lambda e: (-e["running_gpu"], -e["queued_gpu"], e["group"])),
        "users": sorted(by_user.values(), key=lambda e: (-e["running_gpu"], -e["queued_gpu"], e["user"])),
    }


def gpu_usage(
    user: AbstractBaseUser,
    *,
    since: date,
    until: date,
    group: str | None = None,
    username: str | None = None,
    now: datetime | None = None,
) -> list[dict]:
    """GPU-hours per day, group and user, over the groups ``user`` may see.

    An attempt counts from entering PREPARING to leaving TERMINATING (GPUs × time), on the day it started;
    attempts still holding GPUs count up to ``now``.
    """
    now = now or timezone.now()
    attempts = Attempt.objects.filter(started_at__date__gte=since, started_at__date__lte=until, gpu__gt=0)
    if not user.is_superuser:
        attempts = attempts.filter(job__group__in=Membership.objects.filter(user=user).values("group_id"))
    if group:
        attempts = attempts.filter(job__group__name=group)
    if username:
        attempts = attempts.filter(job__user__username=username)
    totals: dict[tuple, float] = {}
    ended = (
        attempts.filter(ended_at__isnull=False)
        .annotate(day=TruncDate("started_at"))
        .values("day", "job__group__name", "job__user__username")
        .annotate(seconds=Sum("gpu_seconds"))
    )
    for row in ended:
        key = (row["day"], row["job__group__name"], row["job__user__username"])
        totals[key] = totals.get(key, 0.0) + (row["seconds"] or 0.0)
    live = attempts.filter(ended_at__isnull=True).values(
        "started_at", "gpu", "replicas", "job__group__name", "job__user__username"
    )
    for row in live:
        key = (timezone.localdate(row["started_at"]), row["job__group__name"], row["job__user__username"])
        seconds = row["gpu"] * row["replicas"] * max((now - row["started_at"]).total_seconds(), 0)
        totals[key] = totals.get(key, 0.0) + seconds
    return [
        {"day": day, "group": g, "user": u, "gpu_hours": round(seconds / 3600, 3)}
        for (day, g, u), seconds in sorted(totals.items())
    ]


# --- logs ---------------------------------------------------------------------------------------------------


class NoFailedReplica(Exception):
    """The log of the first failed replica was asked for, and no replica of the attempt failed (so far)."""


class ReplicaNotFailed(Exception):
    """A replica was named together with ``failed`` and it is not the attempt's first failed replica."""


def attempt_log_rank(attempt: Attempt | None, *, replica: int | None = None, failed: bool = False) -> int:
    """The rank whose log to read of ``attempt`` (None: the job has no attempt yet): ``replica`` (default 0), or
    with ``failed`` the first replica that failed in that attempt, as mcli's ``logs --failed``.

    Raises ``NoFailedReplica`` when ``failed`` is asked of an attempt none of whose replicas failed, and
    ``ReplicaNotFailed`` when ``replica`` is given with ``failed`` and is another rank. Whether ``replica`` exists
    is the caller's to check.
    """
    if not failed:
        return 0 if replica is None else replica
    if attempt is None:
        raise NoFailedReplica("The job has no attempt yet, so no replica has failed.")
    if attempt.failed_rank is None:
        raise NoFailedReplica(f"No replica of attempt {attempt.number} failed.")
    if replica is not None and replica != attempt.failed_rank:
        raise ReplicaNotFailed(
            f"Replica {replica} is not the first failed replica of attempt {attempt.number} (replica "
            f"{attempt.failed_rank} is); leave out replica, or failed."
        )
    return attempt.failed_rank
