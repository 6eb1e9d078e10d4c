"""The recent history as a workload: the jobs that ran and ended, the quotas and nodes as they are now."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .workload import GroupSpec, WorkJob, Workload


@dataclass
class History:
    workload: Workload
    observed: dict[str, list[float]]  # group → the waits the jobs really had (submit → last admission), seconds
    since: datetime
    cluster: str  # where the nodes came from, in words


def workload_from_history(days: float, *, now: datetime | None = None) -> History:
    """The jobs queued in the last ``days`` that ran and ended, as a workload: submit offsets from the first one,
    group, user, GPUs and replicas, priority, preemptible, and how long the last attempt ran (started → finished);
    the groups' GPU quotas as they are now; the nodes the scheduler last recorded for the configured backend
    (none recorded: one node of JOBSITE_LOCAL_GPUS)."""
    from django.conf import settings
    from django.utils import timezone

    from jobs.choices import TERMINAL_PHASES
    from jobs.models import GroupQuota, Job
    from jobs.models import Node as NodeRow

    now = now or timezone.now()
    since = now - timedelta(days=days)
    rows = list(Job.objects.filter(queued_at__gte=since, phase__in=TERMINAL_PHASES, started_at__isnull=False,
                                   finished_at__isnull=False)
                .order_by("queued_at", "id")
                .values("name", "group__name", "user__username", "gpu", "replicas", "priority", "preemptible",
                        "queued_at", "admitted_at", "started_at", "finished_at"))
    first = rows[0]["queued_at"] if rows else now
    jobs, observed = [], {}
    for r in rows:
        jobs.append(WorkJob(
            submit=(r["queued_at"] - first).total_seconds(), group=r["group__name"], user=r["user__username"],
            gpus=r["gpu"], duration=max((r["finished_at"] - r["started_at"]).total_seconds(), 0.0),
            priority=r["priority"], replicas=r["replicas"], preemptible=r["preemptible"], name=r["name"],
        ))
        admitted = r["admitted_at"] or r["started_at"]
        observed.setdefault(r["group__name"], []).append(max((admitted - r["queued_at"]).total_seconds(), 0.0))
    groups = {q.group.name: GroupSpec(q.quota, q.limit, q.user_quota)
              for q in GroupQuota.objects.filter(resource="gpu").select_related("group")}
    recorded = [(n.name, int(n.allocatable.get("gpu", 0)))
                for n in NodeRow.objects.filter(backend=settings.JOBSITE_BACKEND).order_by("name")]
    recorded = [n for n in recorded if n[1] > 0]
    if recorded:
        cluster = f"the {len(recorded)} node(s) last recorded for the {settings.JOBSITE_BACKEND} backend"
    else:
        recorded = [("local", settings.JOBSITE_LOCAL_GPUS)]
        cluster = f"no node recorded: one node of {settings.JOBSITE_LOCAL_GPUS} GPUs (JOBSITE_LOCAL_GPUS)"
    workload = Workload(jobs=jobs, groups=groups, node_list=recorded)
    return History(workload, observed, since, cluster)
