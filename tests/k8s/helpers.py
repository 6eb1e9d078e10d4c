"""Helpers of the end-to-end tests of the Kubernetes backend (the emulator as cluster, the tests as kubelet)."""

from __future__ import annotations

import contextlib

from jobs.choices import Phase
from scheduler.backend_factory import get_backend
from scheduler.backends.kubernetes import KubernetesBackend
from scheduler.passes import schedule_pass
from scheduler.sync import sync_jobs
from tests import waiting

from .conftest import wait_for


def backend() -> KubernetesBackend:
    b = get_backend()
    assert isinstance(b, KubernetesBackend)
    return b


def name_of(job, attempt=1, rank=0):
    return f"job-{job.pk}-{attempt}-{rank}"


def admit_and_launch(job):
    schedule_pass()
    sync_jobs()  # launches the admitted, never-launched attempt
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING, (job.phase, job.message)
    return job


def settle(predicate_by_name: dict):
    """Wait until the backend's pod cache shows each pod as its predicate wants (None: the pod is gone)."""
    b = backend()
    b.start()
    informer = b.pods_informer
    assert informer.wait_synced(30)
    for name, predicate in predicate_by_name.items():
        if predicate is None:
            wait_for(lambda n=name: informer.get(n) is None, what=f"{name} gone from the cache")
        else:
            wait_for(lambda n=name, p=predicate: informer.get(n) is not None and p(informer.get(n)),
                     what=f"{name} in the cache")


def phase_is(phase):
    return lambda pod: (pod.get("status") or {}).get("phase") == phase


def has_waiting(reason):
    def check(pod):
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        return any((c.get("state") or {}).get("waiting", {}).get("reason") == reason for c in statuses)

    return check


def sync_until(job, phases, run_hooks, timeout=30.0):
    """Sync rounds until ``job`` is in one of ``phases``, or the timeout: the job as it then is (the caller asserts)."""

    def reached():
        run_hooks(sync_jobs)
        job.refresh_from_db()
        return job.phase in phases

    with contextlib.suppress(waiting.WaitTimeout):
        waiting.wait_for(reached, timeout=timeout, interval=0.02)
    return job
