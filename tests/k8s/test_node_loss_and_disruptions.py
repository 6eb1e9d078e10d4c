"""End to end on the emulator: what a real cluster does to a job through no fault of its own.

A dead node: the node lifecycle controller sets the pod's Ready condition False and taints the node unreachable;
the taint manager's eviction leaves the pod Terminating for ever (no kubelet confirms it: a finalizer stands in for
that kubelet here, and the test, as the API server, drops it once it sees a forced deletion). A preemption by the
cluster's scheduler: DisruptionTarget, then exit 137. Neither spends the job's backoff.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobs.choices import Phase
from jobs.selectors import group_usage
from jobs.services import EXIT_FAILURES
from scheduler.passes import schedule_pass
from scheduler.sync import sync_jobs

from .conftest import NAMESPACE
from .helpers import admit_and_launch, name_of, phase_is, settle, sync_until

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("k8s")]

KUBELET_CONFIRMS = "test.jobsite/kubelet-confirms"


def ready(status: str, *extra: dict) -> list[dict]:
    return [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": status}, *extra]


def gpus_held(job) -> int:
    return group_usage([job.group])[job.group_id]["gpu"]


def backoff_spent(job) -> int:
    return job.attempts.filter(outcome__in=EXIT_FAILURES).count()


def running_job(submit, core, kubelet, run_hooks, *, finalizer: bool = False):
    job = admit_and_launch(submit("bob", "gpu-1"))
    name = name_of(job)
    if finalizer:
        core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"finalizers": [KUBELET_CONFIRMS]}})
    kubelet.schedule(name)
    kubelet.running(name)
    kubelet.patch(name, {"conditions": ready("True")})
    settle({name: phase_is("Running")})
    job = sync_until(job, {Phase.RUNNING}, run_hooks)
    assert job.phase == Phase.RUNNING
    return job, name


def test_a_lost_node_frees_the_jobs_quota_force_deletes_its_stuck_pod_and_requeues_it(
        submit, core, kubelet, k8s, run_hooks, settings):
    settings.JOBSITE_NODE_LOST_GRACE_SECONDS = 60
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": kubelet.node},
                      "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    job, name = running_job(submit, core, kubelet, run_hooks, finalizer=True)
    assert gpus_held(job) == 1

    # The node stops reporting: NotReady and tainted; its pod not Ready, then evicted and stuck Terminating.
    core.patch_node(kubelet.node, {"spec": {"taints": [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]}})
    core.patch_node_status(kubelet.node, {"status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}})
    kubelet.patch(name, {"conditions": ready("False")})
    core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=30)
    settle({name: lambda pod: pod["metadata"].get("deletionTimestamp") and pod["status"]["phase"] == "Running"})

    job = sync_until(job, {Phase.UNKNOWN}, run_hooks)
    assert job.phase == Phase.UNKNOWN, (job.phase, job.message)
    assert f"node {kubelet.node} running pod {name} is unreachable" in job.message
    assert "stuck terminating" in job.message

    later = job.updated_at + timedelta(seconds=61)  # past the grace
    run_hooks(sync_jobs, now=later)
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.TERMINATING, "NodeLost")  # held until the pod is really gone
    assert gpus_held(job) == 1
    [forced] = [q for m, p, q, _ in k8s.emu.journal if m == "DELETE" and p.endswith(f"/pods/{name}")
                and q.get("gracePeriodSeconds") == "0"]
    assert forced

    # The API server completes a forced deletion without the kubelet.
    core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"finalizers": None}})
    settle({name: None})
    run_hooks(sync_jobs, now=later)
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.PENDING, "NodeLost")
    assert gpus_held(job) == 0
    assert job.attempts.get(number=1).outcome == "NodeLost"
    assert backoff_spent(job) == 0


def test_a_pod_preempted_by_the_clusters_scheduler_is_requeued_without_losing_a_retry(
        submit, core, kubelet, run_hooks):
    preempted, name = running_job(submit, core, kubelet, run_hooks)
    kubelet.exited(name, 137)
    kubelet.patch(name, {"conditions": ready("False", {"type": "DisruptionTarget", "status": "True",
                                                       "reason": "PreemptionByScheduler"})})
    settle({name: lambda pod: any(c["type"] == "DisruptionTarget" for c in pod["status"]["conditions"])})
    preempted = sync_until(preempted, {Phase.PENDING, Phase.BACKOFF, Phase.FAILED}, run_hooks)
    assert (preempted.phase, preempted.reason) == (Phase.PENDING, "Disrupted")
    assert "Preempted by the cluster's scheduler: requeued (1/10)" in preempted.events.get(reason="Disrupted").message
    assert preempted.attempts.get(number=1).outcome == "Disrupted"
    assert backoff_spent(preempted) == 0

    # The same exit without the condition is the job's own failure: one retry spent.
    failed, other = running_job(submit, core, kubelet, run_hooks)
    kubelet.exited(other, 137)
    settle({other: phase_is("Failed")})
    failed = sync_until(failed, {Phase.BACKOFF, Phase.PENDING, Phase.FAILED}, run_hooks)
    assert failed.phase == Phase.BACKOFF and backoff_spent(failed) == 1

    schedule_pass()  # the preempted job runs again as its second attempt
    run_hooks(sync_jobs)
    preempted.refresh_from_db()
    assert preempted.current_attempt.number == 2 and preempted.phase == Phase.PREPARING


def test_past_the_disruption_limit_the_job_fails_with_a_clear_message(submit, core, kubelet, run_hooks, settings):
    settings.JOBSITE_K8S_MAX_DISRUPTIONS = 0
    job, name = running_job(submit, core, kubelet, run_hooks)
    kubelet.patch(name, {"phase": "Failed", "reason": "Evicted",
                         "message": "The node was low on resource: memory. Threshold quantity: 100Mi."})
    settle({name: phase_is("Failed")})
    job = sync_until(job, {Phase.FAILED, Phase.PENDING}, run_hooks)
    assert (job.phase, job.reason) == (Phase.FAILED, "DisruptionLimitExceeded")
    assert job.message.startswith("Evicted: node memory pressure; disrupted by the cluster 1 time(s) (limit 0)")
