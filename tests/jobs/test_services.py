"""The transition service and submission: events, attempts, GPU-seconds, validation writes nothing."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from jobs import services
from jobs.choices import Phase
from jobs.models import Job, JobEvent
from jobs.state_machine import InvalidTransition
from scheduler.passes import schedule_pass

pytestmark = [pytest.mark.fast, pytest.mark.django_db]


def test_submit_writes_job_and_submitted_event(submit):
    job = submit("bob", "gpu-1", command="echo hi", env={"LR": "0.1"})
    assert (job.phase, job.status, job.gpu, job.replicas) == (Phase.SUBMITTED, "Submitted", 1, 1)
    assert list(job.events.values_list("reason", flat=True)) == ["Submitted"]
    assert job.env == {"LR": "0.1"} and job.name == "echo"


def test_transition_checks_state_machine_and_writes_nothing_on_refusal(submit):
    job = submit("bob")
    with pytest.raises(InvalidTransition):
        services.job_transition(job=job, phase=Phase.RUNNING)
    job.refresh_from_db()
    assert job.phase == Phase.SUBMITTED and job.events.count() == 1


def test_transition_records_an_event_only_when_something_changes(submit):
    job = submit("bob")
    services.job_transition(job=job, phase=Phase.PENDING, reason="GroupQuota", message="a", queue_position=2)
    services.job_transition(job=job, phase=Phase.PENDING, reason="GroupQuota", message="b", queue_position=1)
    job.refresh_from_db()
    assert job.message == "b" and job.queue_position == 1
    assert list(job.events.values_list("reason", flat=True)) == ["Submitted", "GroupQuota"]


def test_gpu_seconds_from_preparing_to_end(submit):
    job = submit("bob", "gpu-2")
    t0 = timezone.now()
    schedule_pass(now=t0)
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING
    services.job_transition(job=job, phase=Phase.RUNNING, now=t0 + timedelta(seconds=10))
    services.job_transition(job=job, phase=Phase.SUCCEEDED, exit_code=0, now=t0 + timedelta(seconds=100))
    attempt = job.attempts.get()
    assert attempt.gpu_seconds == pytest.approx(200.0)  # 2 GPU × 100 s from PREPARING
    assert attempt.ended_at == t0 + timedelta(seconds=100) and attempt.exit_code == 0


def test_cancel_pending_job_ends_at_once(submit, world):
    job = submit("bob")
    services.job_cancel(job=job, by=world.users["bob"])
    job.refresh_from_db()
    assert (job.phase, job.status, job.reason) == (Phase.CANCELLED, "Cancelled", "CancelledByUser")
    assert job.finished_at is not None
    with pytest.raises(ValidationError):
        services.job_cancel(job=job, by=world.users["bob"])


def test_cancel_running_job_goes_through_terminating(submit, world):
    job = submit("bob")
    schedule_pass()
    job.refresh_from_db()
    services.job_cancel(job=job, by=world.users["bob"])
    job.refresh_from_db()
    assert (job.phase, job.termination_target) == (Phase.TERMINATING, Phase.CANCELLED)


def test_retry_then_fail_after_backoff_limit(submit):
    job = submit("bob", backoff_limit=1)
    schedule_pass()
    job.refresh_from_db()
    services.job_retry_or_fail(job=job, exit_code=3, reason="Error", message="exit 3")
    job.refresh_from_db()
    assert job.phase == Phase.BACKOFF and job.retry_at is not None and "retry 1/1 in 10 s" in job.message
    services.job_transition(job=job, phase=Phase.PENDING, reason="Retrying")
    schedule_pass()
    job.refresh_from_db()
    assert job.current_attempt.number == 2
    services.job_retry_or_fail(job=job, exit_code=3, reason="Error", message="exit 3")
    job.refresh_from_db()
    assert (job.phase, job.status, job.exit_code) == (Phase.FAILED, "Fail", 3)


def admitted(submit, **spec):
    job = submit("bob", **spec)
    schedule_pass()
    job.refresh_from_db()
    assert job.phase == Phase.PREPARING
    return job


@pytest.mark.parametrize("phase, status, reason, expected", [
    (Phase.RUNNING, "CrashLoopBackOff", "CrashLoopBackOff", "Warning"),
    (Phase.PREPARING, "ErrImagePull", "", "Warning"),
    (Phase.PREPARING, "Pending", "", "Normal"),
    (Phase.TERMINATING, None, "Preempted", "Warning"),
    (Phase.TERMINATING, None, "FailedImagePull", "Warning"),
    (Phase.TERMINATING, None, "CancelledByUser", "Normal"),
    (Phase.PENDING, None, "NodeLost", "Warning"),
    (Phase.RUNNING, None, "", "Normal"),
    (Phase.UNKNOWN, None, "NodeUnresponsive", "Warning"),
])
def test_event_types_follow_kubernetes_meaning(submit, phase, status, reason, expected):
    job = admitted(submit)
    if phase == Phase.PENDING:  # NodeLost: from UNKNOWN
        services.job_transition(job=job, phase=Phase.UNKNOWN, reason="NodeUnresponsive")
    services.job_transition(job=job, phase=phase, status=status, reason=reason, message="m",
                            **({"termination_target": Phase.CANCELLED} if phase == Phase.TERMINATING else {}))
    assert job.events.last().type == expected


def test_queued_again_shows_no_earlier_attempts_exit_code_or_times(submit):
    job = admitted(submit, backoff_limit=0)
    services.job_transition(job=job, phase=Phase.RUNNING)
    services.job_retry_or_fail(job=job, exit_code=3, reason="Error", message="exit 3")
    job.refresh_from_db()
    assert (job.phase, job.exit_code) == (Phase.FAILED, 3) and job.started_at and job.admitted_at
    services.job_restart(job=job, by=job.user)
    job.refresh_from_db()
    assert (job.phase, job.exit_code, job.started_at, job.admitted_at, job.finished_at) == (
        Phase.PENDING, None, None, None, None)
    attempt = job.attempts.get()
    assert attempt.exit_code == 3 and attempt.ended_at is not None  # the attempt keeps its own


def test_ttl_cleanup_is_recorded_once_with_an_event(submit):
    job = admitted(submit)
    services.job_transition(job=job, phase=Phase.SUCCEEDED, exit_code=0)
    now = timezone.now()
    services.job_mark_cleaned(job_id=job.pk, now=now)
    services.job_mark_cleaned(job_id=job.pk, now=now + timedelta(seconds=5))
    job.refresh_from_db()
    assert job.cleaned_at == now
    [event] = job.events.filter(reason="CleanedUp")
    assert event.type == "Normal" and "after the end" in event.message and "logs are kept" in event.message


@pytest.mark.parametrize("field, data", [
    ("group", {"group": "nope"}),
    ("group", {"group": "other"}),  # bob is not a member
    ("image", {"image": "nope"}),
    ("instance_type", {"instance_type": "nope"}),
    ("command", {"command": "   "}),
    ("command", {"command": "x" * (64 * 1024 + 1)}),
    ("env", {"env": {"1BAD": "x"}}),
    ("env", {"env": {"JOB_ID": "7"}}),
    ("env", {"env": ["A=1"]}),
    ("replicas", {"replicas": 0}),
    ("replicas", {"replicas": 2, "instance_type": "gpu-4"}),  # 8 GPU > user quota 4
    ("name", {"name": "bad\x01name"}),
])
def test_validation_names_the_field_and_writes_nothing(world, field, data):
    base = {"group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny", "command": "true"}
    with pytest.raises(ValidationError) as err:
        services.job_spec_validate(user=world.users["bob"], data={**base, **data})
    assert field in err.value.message_dict
    assert Job.objects.count() == 0 and JobEvent.objects.count() == 0


def test_instance_type_not_allowed_in_group(world):
    from jobs.models import InstanceType

    InstanceType.objects.create(name="big", gpu=1).groups.add(world.groups["research"])
    with pytest.raises(ValidationError) as err:
        services.job_spec_validate(user=world.users["bob"], data={
            "group": "phusers", "image": "base-notebook", "instance_type": "big", "command": "true"})
    assert "not allowed in group 'phusers'" in err.value.message_dict["instance_type"][0]
