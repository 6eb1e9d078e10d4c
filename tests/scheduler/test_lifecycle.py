"""Lifecycle rules 7-12 with real processes and a controllable clock (no sleeping for minutes)."""

import dataclasses
import os
import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import services
from jobs.choices import Phase
from jobs.logs import replica_log_path
from jobs.selectors import queue_positions
from scheduler.backend_factory import get_backend
from scheduler.backends.local import LocalBackend
from scheduler.passes import schedule_pass
from scheduler.values import ReplicaState
from tests import waiting

from .conftest import wait_for

pytestmark = pytest.mark.django_db


class NeverStarts(LocalBackend):
    """A cluster where pods are created but never get a node: every replica stays ContainerCreating."""

    def observe(self, **kw):
        return [dataclasses.replace(o, state=ReplicaState.STARTING, status="ContainerCreating")
                if o.state == ReplicaState.RUNNING else o for o in super().observe(**kw)]


def stuck_creating(backend, job) -> None:
    """Wait until every replica of the current attempt shows the never-ending ContainerCreating (its command runs
    under its supervisor). Only then may the clock jump past the start timeout: a launch of which nothing has
    started by then is, rightly, taken for a launcher that died."""

    def creating():
        job.refresh_from_db()
        seen = backend.observe(job_id=job.pk, attempt_number=job.current_attempt.number, replicas=job.replicas)
        return all(o.status == "ContainerCreating" for o in seen)

    waiting.wait_for(creating, timeout=30, message=f"the replicas of job #{job.pk} to start")


def test_attempt_stuck_preparing_is_requeued_with_backoff_then_fails(submit, clock, settings):
    settings.JOBSITE_REQUEUE_LIMIT = 2
    backend = NeverStarts(root=settings.JOBSITE_LOCAL_ROOT, log_layout=replica_log_path)
    job = submit("bob", command="sleep 600")
    t = timezone.now()
    clock(now=t, backend=backend)
    clock(now=t, backend=backend)  # launched, preparing
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING

    for n, delay in [(1, 60), (2, 120)]:
        stuck_creating(backend, job)
        t += timedelta(seconds=181)
        clock(now=t, backend=backend)  # stuck: terminate and requeue
        job.refresh_from_db()
        assert job.reason == "Requeued" and f"requeued ({n}/2), eligible again in {delay} s" in job.message
        wait_for(job, {Phase.PENDING}, clock, now=t, backend=backend)
        assert job.reason == "Requeued"
        clock(now=t + timedelta(seconds=delay - 1), backend=backend)  # still backing off: not admitted
        job.refresh_from_db()
        assert job.phase == Phase.PENDING
        t += timedelta(seconds=delay)
        clock(now=t, backend=backend)
        job.refresh_from_db()
        assert job.phase == Phase.PREPARING and job.current_attempt.number == n + 1

    clock(now=t, backend=backend)
    stuck_creating(backend, job)
    t += timedelta(seconds=181)
    clock(now=t, backend=backend)
    wait_for(job, {Phase.FAILED}, clock, now=t, backend=backend)
    assert job.reason == "RequeueLimitExceeded"
    assert job.backoff_limit == 6 and job.attempts.filter(outcome="Requeued").count() == 2


def test_interactive_job_restarts_in_place_and_closes_as_deleted(submit, clock, act, world):
    job = submit("bob", command="echo up; exit 2", job_type="interactive")
    assert job.active_deadline_seconds == 12 * 3600  # its own default timeout
    wait_for(job, {Phase.RUNNING}, clock)
    deadline = time.monotonic() + 10
    while job.status != "CrashLoopBackOff" and time.monotonic() < deadline:
        clock()
        job.refresh_from_db()
    assert (job.phase, job.status, job.exit_code) == (Phase.RUNNING, "CrashLoopBackOff", 2)
    assert "restart #1 in 10 s" in job.message
    clock(now=job.retry_at + timedelta(seconds=1))  # after the delay: restarted in the same attempt
    job.refresh_from_db()
    assert job.reason == "Restarted" and job.attempts.count() == 1
    deadline = time.monotonic() + 10
    log = get_backend().log_path(job_id=job.pk, attempt_number=1, rank=0)
    while log.read_text().count("up") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.read_text().count("up") == 2
    act(services.job_cancel, job=job, by=world.users["bob"])
    wait_for(job, {Phase.CANCELLED}, clock)
    assert job.status == "Deleted"  # never SUCCEEDED: closed by its user


def test_stopped_job_restarts_as_attempt_2(submit, clock, act, world):
    job = submit("bob", command="echo run $JOB_ATTEMPT; sleep 600")
    wait_for(job, {Phase.RUNNING}, clock)
    act(services.job_cancel, job=job, by=world.users["bob"], stop=True)
    wait_for(job, {Phase.CANCELLED}, clock)
    assert (job.status, job.reason) == ("Stopped", "StoppedByUser")
    act(services.job_restart, job=job, by=world.users["bob"])
    wait_for(job, {Phase.RUNNING}, clock)
    assert job.current_attempt.number == 2
    assert "Restarted" in job.events.values_list("reason", flat=True)
    act(services.job_cancel, job=job, by=world.users["bob"])
    wait_for(job, {Phase.CANCELLED}, clock)


def test_restart_refuses_running_and_succeeded_jobs(submit, clock, act, world):
    from django.core.exceptions import ValidationError

    job = submit("bob", command="true")
    with pytest.raises(ValidationError, match="stop it first"):
        act(services.job_restart, job=job, by=world.users["bob"])
    wait_for(job, {Phase.SUCCEEDED}, clock)
    with pytest.raises(ValidationError, match="clone it"):
        act(services.job_restart, job=job, by=world.users["bob"])


def test_a_replica_lost_with_all_it_ran_is_retried_at_once_without_spending_backoff(submit, clock, act):
    """The supervisor and its whole process group killed: the backend sees nothing of the replica is left, so no
    node-lost grace is waited out (issue 21): NodeLost at once, and a new attempt although backoff_limit is 0."""
    job = submit("bob", command="echo attempt $JOB_ATTEMPT; sleep 600", backoff_limit=0)
    wait_for(job, {Phase.RUNNING}, clock)
    state = get_backend().root / "state" / f"job-{job.pk}" / "attempt-1" / "replica-0"
    os.killpg(int((state / "runner.pid").read_text().split()[0]), signal.SIGKILL)  # the supervisor and all it ran
    wait_for(job, {Phase.TERMINATING, Phase.PENDING, Phase.PREPARING}, clock)
    assert job.reason == "NodeLost" and "nothing of it is left" in job.message
    assert not job.events.filter(reason="NodeUnresponsive").exists()
    wait_for(job, {Phase.PENDING, Phase.PREPARING, Phase.RUNNING}, clock)
    assert job.attempts.get(number=1).outcome == "NodeLost"
    wait_for(job, {Phase.RUNNING}, clock)
    assert job.current_attempt.number == 2  # retried although backoff_limit is 0
    act(services.job_cancel, job=job, by=job.user)
    wait_for(job, {Phase.CANCELLED}, clock)


def test_pending_reason_names_the_quota_with_numbers(submit, clock):
    submit("bob", "gpu-4", command="sleep 600")
    waiting = submit("pan", "gpu-2", command="true")
    schedule_pass()
    waiting.refresh_from_db()
    assert waiting.reason == "GroupQuota"
    assert waiting.message == "waiting for group GPU quota of phusers: 4 GPU used of 4 GPU, asks 2 GPU"
    assert queue_positions([waiting.pk]) == {waiting.pk: 1}  # derived when read


def test_inadmissible_reason_follows_quota_changes_and_returns_to_pending(submit, world):
    from jobs.models import GroupQuota

    blocker = submit("pan", "gpu-4", command="sleep 600")  # holds phusers' 4 GPUs: bob's job can only wait
    schedule_pass()
    job = submit("bob", "gpu-2", replicas=2, command="true")
    quotas = GroupQuota.objects.filter(group=world.groups["phusers"], resource="gpu")
    quotas.update(user_quota=2)  # an admin lowers bob's quota below what the job asks
    schedule_pass()
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.INADMISSIBLE, "ExceedsUserQuota")
    quotas.update(user_quota=4, quota=2)
    schedule_pass()
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.INADMISSIBLE, "ExceedsGroupQuota")
    assert job.message == "asks 4 GPU, more than the group GPU quota 2 GPU of phusers"
    schedule_pass()  # unchanged: no new event
    assert list(job.events.filter(type="Warning").values_list("reason", flat=True)) == [
        "ExceedsUserQuota", "ExceedsGroupQuota"]
    quotas.update(quota=4)
    schedule_pass()
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.PENDING, "GroupQuota")  # it could fit now: back in the queue
    quotas.update(quota=2)
    schedule_pass()
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.INADMISSIBLE, "ExceedsGroupQuota")  # and back
    services.job_cancel(job=blocker, by=blocker.user)
