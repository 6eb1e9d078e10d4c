"""Resource limits of local replicas, from the settings (README "Resource limits"): the backend's side of cgroups.py.

JOBSITE_LOCAL_LIMITS chooses: ``auto`` (the default: each controller this machine lets the server use, and a
warning, at start and in each job's log, naming those it does not), ``require`` (the scheduler refuses to start
while one is missing) or ``off`` (no limits). Each replica gets its instance type's memory (no swap) and CPU, at most
JOBSITE_LOCAL_PIDS_MAX processes and threads, and JOBSITE_LOCAL_DISK_BYTES in its working directory.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from scheduler.values import LaunchSpec

from . import cgroups

log = logging.getLogger(__name__)

MODES = ("auto", "require", "off")
WHAT = {"memory": "memory limit", "cpu": "CPU quota", "pids": "process-count limit"}


def missing_text(missing: tuple[tuple[str, str], ...]) -> str:
    names = ", ".join(c for c, _ in missing)
    without = " and ".join(WHAT[c] for c, _ in missing)
    why = "; ".join(f"{c}: {reason}" for c, reason in missing)
    return f"the cgroup controller(s) {names} cannot be used ({why}), so jobs run without a {without}"


class Limiter:
    """What the backend hands each supervisor, and the cgroups it removes after the end."""

    def __init__(self, mode: str, found: cgroups.Found | None = None):
        self.mode, self.found = mode, found
        self.warning = ""
        if found is not None and found.missing:
            self.warning = (f"{missing_text(found.missing)}. Run the server as root or in a delegated cgroup v2 "
                            "subtree (JOBSITE_LOCAL_CGROUP_PARENT), or set JOBSITE_LOCAL_LIMITS=off to run "
                            "without limits on purpose.")

    @property
    def parents(self) -> tuple[tuple[str, int, str], ...]:
        return self.found.parents if self.found is not None else ()

    def runner_options(self, spec: LaunchSpec, rank: int) -> list[str]:
        """The supervisor's ``--limits`` for replica ``rank`` of ``spec``."""
        if self.mode == "off":
            return []
        plan = cgroups.Plan(
            name=cgroups.leaf_name(spec.job_id, spec.attempt_number, rank), parents=self.parents,
            limits=cgroups.limits_for(spec.request, pids=settings.JOBSITE_LOCAL_PIDS_MAX,
                                      disk=settings.JOBSITE_LOCAL_DISK_BYTES),
            disk_check_seconds=float(settings.JOBSITE_LOCAL_DISK_CHECK_SECONDS), required=self.mode == "require",
            warning=self.warning,
        )
        return ["--limits", plan.to_json()]

    def remove(self, *, job_id: int, attempt_number: int, replicas: int) -> None:
        """Remove the cgroups of an attempt (a supervisor that died left its own), killing what is left in them."""
        for rank in range(replicas):
            group = cgroups.ReplicaCgroup(cgroups.Plan(name=cgroups.leaf_name(job_id, attempt_number, rank),
                                                       parents=self.parents))
            group.kill()
            group.remove()

    def prune(self) -> None:
        """Remove the empty cgroups left by supervisors that died (their replicas ended), of any installation."""
        cgroups.prune(p for _, _, p in self.parents)


def resolve(root_id: str) -> Limiter:
    """The limits of this installation's replicas, from JOBSITE_LOCAL_LIMITS. Refuses (the scheduler does not
    start) when the setting requires limits this machine cannot set; warns when ``auto`` finds one missing."""
    mode = str(settings.JOBSITE_LOCAL_LIMITS).strip().lower()
    if mode not in MODES:
        raise ImproperlyConfigured(f"JOBSITE_LOCAL_LIMITS must be one of {', '.join(MODES)}, not {mode!r}.")
    if mode == "off":
        log.info("JOBSITE_LOCAL_LIMITS=off: job processes run without memory, CPU or process limits")
        return Limiter(mode)
    found = cgroups.detect(f"jobsite-{root_id}", parent=settings.JOBSITE_LOCAL_CGROUP_PARENT)
    if found.missing and mode == "require":
        raise ImproperlyConfigured(
            f"JOBSITE_LOCAL_LIMITS=require, but {missing_text(found.missing)}: the scheduler does not start. Run "
            "the server as root or in a delegated cgroup v2 subtree (JOBSITE_LOCAL_CGROUP_PARENT), or set "
            "JOBSITE_LOCAL_LIMITS=auto or off."
        )
    limiter = Limiter(mode, found)
    if limiter.warning:
        log.warning("JOBSITE_LOCAL_LIMITS=auto: %s", limiter.warning)
    return limiter
