"""Fencing: a scheduler deposed while a create or delete was in flight has it refused; only the lease holder
changes the cluster (scheduler.leader.FENCE, checked by the actuator and by the backend before every mutation)."""

from __future__ import annotations

import pytest

from scheduler.actuator import Actuator
from scheduler.launch import launch_spec
from scheduler.leader import FENCE, Deposed, LeaseElector
from scheduler.passes import schedule_pass
from scheduler.sync import orphans_delete

from .conftest import NAMESPACE
from .helpers import admit_and_launch, backend, name_of
from .test_leader import Clock, coordination, holder  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("k8s")]


@pytest.fixture
def fenced(coordination, monkeypatch):  # noqa: F811
    """Scheduler a leads with the deployed timings (lease 15 s, renew deadline 10 s) and fences this process."""
    clock = Clock()
    monkeypatch.setenv("POD_NAME", "scheduler-a")
    a = LeaseElector(coordination, name="jobsite-scheduler", namespace=NAMESPACE, lease_seconds=15,
                     renew_deadline=10, clock=clock)
    assert a.acquire_or_renew() is True
    FENCE.use(a.holds)
    yield a, clock
    FENCE.use(None)


def mutations(k8s):
    return [(m, p) for m, p, *_ in k8s.emu.journal if m in ("POST", "DELETE", "PATCH") and "/leases" not in p]


def test_the_leader_acts_while_it_holds_the_lease(fenced, submit, core):
    a, clock = fenced
    clock.now += 9  # within the renew deadline
    job = admit_and_launch(submit("bob", "gpu-1"))
    assert core.read_namespaced_pod(name_of(job), NAMESPACE)


def test_a_deposed_leaders_in_flight_stop_is_refused(fenced, submit, core, k8s, coordination, monkeypatch):  # noqa: F811
    a, clock = fenced
    job = admit_and_launch(submit("bob", "gpu-1"))
    # a stalls (a long GC pause, a partitioned node) past its renew deadline; b takes the lease over.
    clock.now += 16
    monkeypatch.setenv("POD_NAME", "scheduler-b")
    b = LeaseElector(coordination, name="jobsite-scheduler", namespace=NAMESPACE, lease_seconds=15, clock=clock)
    assert b.acquire_or_renew() is False  # b first sees the record...
    clock.now += 16
    assert b.acquire_or_renew() is True  # ...and takes it once it has not changed for a lease
    assert holder(coordination) == "scheduler-b"
    before = mutations(k8s)
    # a's stop, decided while it led, now runs: refused, the pod is untouched.
    Actuator(backend()).stop(attempt_id=job.current_attempt_id, job_id=job.pk, attempt_number=1, replicas=1,
                             force=True)
    with pytest.raises(Deposed, match="no longer holds the leader lease"):
        backend().stop(job_id=job.pk, attempt_number=1, replicas=1, force=True)
    core.create_namespaced_pod(NAMESPACE, {  # an orphan: the deposed leader's cleanup leaves it to the new leader
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job-99999-1-0", "labels": {
            "app.kubernetes.io/managed-by": "jobsite", "jobsite/installation": backend().defaults.installation,
            "jobsite/job-id": "99999", "jobsite/attempt": "1", "jobsite/replica": "0"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
    before = mutations(k8s)
    with pytest.raises(Deposed):
        orphans_delete(backend=backend())
    assert mutations(k8s) == before
    pod = core.read_namespaced_pod(name_of(job), NAMESPACE)
    assert pod.metadata.deletion_timestamp is None


def test_a_deposed_leaders_in_flight_launch_creates_nothing(fenced, submit, core, k8s):
    a, clock = fenced
    job = submit("bob", "gpu-1")
    schedule_pass()
    job.refresh_from_db()
    clock.now += 11  # past the renew deadline without renewing: a no longer acts
    assert a.holds() is False
    with pytest.raises(Deposed):
        backend().launch(launch_spec(job, job.current_attempt))
    assert mutations(k8s) == []
    assert core.list_namespaced_pod(NAMESPACE).items == []
    # Renewed in time again: it acts again.
    assert a.acquire_or_renew() is True
    backend().launch(launch_spec(job, job.current_attempt))
    assert core.read_namespaced_pod(name_of(job), NAMESPACE)
