"""One attempt, one fate on the Kubernetes backend: a failed rank fails the attempt, the other pods are deleted,
and the job is retried with the first failing rank's exit code whatever the timing (the emulator as cluster)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.choices import Phase
from scheduler.passes import schedule_pass
from scheduler.sync import housekeeping, sync_jobs

from .helpers import admit_and_launch, name_of, phase_is, settle, sync_until

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("k8s")]

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def attempt_pods(job, attempt):
    return [name_of(job, attempt=attempt, rank=r) for r in (0, 1)]


def fail_rank_1_early(kubelet, names):
    kubelet.running(names[0])
    kubelet.exited(names[1], 5)
    return {names[0]: phase_is("Running"), names[1]: phase_is("Failed")}


def fail_together(kubelet, names):
    kubelet.exited(names[0], 3, finished_at=T0)
    kubelet.exited(names[1], 5, finished_at=T0)
    return {n: phase_is("Failed") for n in names}


def fail_after_success(kubelet, names):
    kubelet.exited(names[0], 0, finished_at=T0)
    kubelet.exited(names[1], 5, finished_at=T0 + timedelta(seconds=4))
    return {names[0]: phase_is("Succeeded"), names[1]: phase_is("Failed")}


def rank_1_killed(kubelet, names):
    kubelet.running(names[0])
    kubelet.exited(names[1], 137)
    return {names[0]: phase_is("Running"), names[1]: phase_is("Failed")}


@pytest.mark.parametrize("play, code, rank, note", [
    (fail_rank_1_early, 5, 1, ""),
    (fail_together, 3, 0, ""),
    (fail_after_success, 5, 1, ""),
    (rank_1_killed, 137, 1, " (killed by SIGKILL)"),
], ids=["one fails early", "all fail together", "one fails after the other succeeded", "one killed by a signal"])
def test_a_failed_rank_fails_the_attempt_which_is_retried(submit, kubelet, run_hooks, core, play, code, rank, note):
    job = submit("lin", "gpu-1", group="research", replicas=2, backoff_limit=1)
    for attempt in (1, 2):
        job = admit_and_launch(job)
        names = attempt_pods(job, attempt)
        settle(play(kubelet, names))
        job = sync_until(job, {Phase.BACKOFF, Phase.FAILED, Phase.TERMINATING}, run_hooks)
        if job.phase == Phase.TERMINATING:  # a rank still ran: its pods are deleted before the retry
            assert job.exit_code == code and job.attempts.get(number=attempt).failed_rank == rank
            run_hooks(sync_jobs)  # the scheduler deletes the attempt's pods
            settle({n: None for n in names})
            job = sync_until(job, {Phase.BACKOFF, Phase.FAILED}, run_hooks)
        assert job.exit_code == code, (job.phase, job.message)
        assert job.message.startswith(f"Attempt {attempt} failed: rank {rank} exited with code {code}{note}; ")
        if attempt == 1:
            assert job.phase == Phase.BACKOFF and job.message.endswith("retry 1/1 in 10 s")
            run_hooks(housekeeping, now=job.retry_at + timedelta(seconds=1))
            run_hooks(schedule_pass)
    assert (job.phase, job.status) == (Phase.FAILED, "Fail")
    assert [(a.outcome, a.exit_code, a.failed_rank) for a in job.attempts.order_by("number")] == [
        ("Error", code, rank)] * 2
    running = [p.metadata.name for p in core.list_namespaced_pod("jobsite-jobs").items
               if p.status and p.status.phase == "Running"]
    assert not running  # never left half-running


def test_all_ranks_succeeding_succeeds(submit, kubelet, run_hooks):
    job = admit_and_launch(submit("lin", "gpu-1", group="research", replicas=2, backoff_limit=1))
    names = attempt_pods(job, 1)
    kubelet.exited(names[0], 0)
    kubelet.running(names[1])
    settle({names[0]: phase_is("Succeeded"), names[1]: phase_is("Running")})
    run_hooks(sync_jobs)
    job.refresh_from_db()
    assert job.phase in (Phase.PREPARING, Phase.RUNNING)  # rank 1 still works
    kubelet.exited(names[1], 0)
    settle({names[1]: phase_is("Succeeded")})
    job = sync_until(job, {Phase.SUCCEEDED, Phase.FAILED, Phase.BACKOFF}, run_hooks)
    assert (job.phase, job.exit_code, job.message) == (Phase.SUCCEEDED, 0, "All replicas exited with code 0")
