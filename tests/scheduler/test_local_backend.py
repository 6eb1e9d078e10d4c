"""End to end on the local backend: real processes, real files, the scheduler's own functions."""

import os
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection

from jobs import services
from jobs.choices import Phase
from jobs.models import Job
from scheduler.backend_factory import get_backend
from scheduler.passes import schedule_pass
from scheduler.sync import housekeeping, sync_jobs
from tests import waiting

pytestmark = pytest.mark.django_db


_on_commit = None


@pytest.fixture(autouse=True)
def _run_on_commit_hooks(django_capture_on_commit_callbacks):
    """Run after-commit side effects (launch, SIGTERM) as production does, inside the test transaction."""
    global _on_commit
    _on_commit = django_capture_on_commit_callbacks
    yield
    _on_commit = None


def tick():
    with _on_commit(execute=True):
        schedule_pass()
        sync_jobs()
        housekeeping()


def run_until(job, phases, timeout=20.0):
    def reached():
        tick()
        job.refresh_from_db()
        return job.phase in phases

    waiting.wait_for(reached, timeout=timeout, message=lambda: f"one of {sorted(phases)}: job stayed {job.phase} "
                                                                f"({job.status}: {job.message})")
    return job


def log_of(job, attempt=1, rank=0):
    return get_backend().log_path(job_id=job.pk, attempt_number=attempt, rank=rank).read_text()


def runner_pid(job, attempt=1, rank=0):
    root = get_backend().root
    return int((root / "state" / f"job-{job.pk}" / f"attempt-{attempt}" / f"replica-{rank}" / "runner.pid")
               .read_text().split()[0])


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_echo_hello_succeeds_with_its_log_and_env(submit):
    job = submit("bob", "gpu-2", command='echo hello; echo "$JOB_ID $JOB_USER $JOB_GROUP $JOB_ATTEMPT '
                 '$RANK/$WORLD_SIZE gpus=$CUDA_VISIBLE_DEVICES $LR"; pwd', env={"LR": "0.5"})
    run_until(job, {Phase.SUCCEEDED, Phase.FAILED})
    assert (job.phase, job.status, job.exit_code) == (Phase.SUCCEEDED, "Succeeded", 0)
    out = log_of(job)
    assert out.splitlines()[0] == "hello"
    assert f"{job.pk} bob phusers 1 0/1 gpus=0,1 0.5" in out
    assert f"job-{job.pk}/attempt-1/replica-0" in out  # its own working directory
    reasons = list(job.events.values_list("reason", flat=True))
    assert reasons[0] == "Submitted" and "Admitted" in reasons and reasons[-1] == "Completed"
    attempt = job.attempts.get()
    assert attempt.exit_code == 0 and attempt.ended_at is not None


def test_exit_3_fails_with_exit_code_and_event_trail(submit):
    job = submit("bob", command="echo about to fail >&2; exit 3", backoff_limit=0)
    run_until(job, {Phase.FAILED, Phase.SUCCEEDED})
    assert (job.phase, job.status, job.reason, job.exit_code) == (Phase.FAILED, "Fail", "Error", 3)
    assert "exited with code 3" in job.message
    assert "about to fail" in log_of(job)
    last = job.events.last()
    assert (last.type, last.reason) == ("Warning", "Error")


def test_retries_until_backoff_limit_then_fails(submit):
    job = submit("bob", command="echo try $JOB_ATTEMPT; exit 1", backoff_limit=2)
    for attempt in (1, 2):
        run_until(job, {Phase.BACKOFF})
        assert job.status == "Error" and f"retry {attempt}/2" in job.message
        housekeeping(now=job.retry_at + timedelta(seconds=1))  # the clock moves past the backoff delay
    run_until(job, {Phase.FAILED})
    assert job.attempts.count() == 3 and job.exit_code == 1
    assert log_of(job, attempt=3).strip() == "try 3"


def test_cancel_running_sleep_ends_cancelled_and_kills_the_process(submit, world):
    job = submit("bob", command="sleep 600")
    run_until(job, {Phase.RUNNING})
    pid = runner_pid(job)
    assert alive(pid)
    started = time.monotonic()
    services.job_cancel(job=job, by=world.users["bob"])
    # The scheduler's sync (run_until) sends SIGTERM to a TERMINATING job's processes.
    run_until(job, {Phase.CANCELLED}, timeout=15)
    assert time.monotonic() - started < 15
    assert job.status == "Cancelled" and job.exit_code == 143  # 128 + SIGTERM
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_a_process_ignoring_sigterm_is_killed_after_the_grace_period(submit, world, settings):
    settings.JOBSITE_TERMINATION_GRACE_SECONDS = 1
    job = submit("bob", command="trap '' TERM; echo ready; while true; do sleep 0.2; done")
    run_until(job, {Phase.RUNNING})
    while "ready" not in log_of(job):
        time.sleep(0.05)
    services.job_cancel(job=job, by=world.users["bob"])
    run_until(job, {Phase.CANCELLED}, timeout=15)
    assert not alive(runner_pid(job))


def test_active_deadline_times_out(submit):
    job = submit("bob", command="sleep 600", active_deadline_seconds=1)
    # The deadline counts from admission: on a busy machine a phase may pass between two looks.
    run_until(job, {Phase.TERMINATING, Phase.TIMED_OUT}, timeout=30)
    run_until(job, {Phase.TIMED_OUT}, timeout=15)
    assert job.status == "TimedOut"
    assert "DeadlineExceeded" in job.events.values_list("reason", flat=True)


def test_replicas_get_rank_and_world_size(submit):
    job = submit("bob", "gpu-1", command="echo rank=$RANK of $WORLD_SIZE on $CUDA_VISIBLE_DEVICES", replicas=2)
    run_until(job, {Phase.SUCCEEDED})
    assert log_of(job, rank=0).strip() == "rank=0 of 2 on 0"
    assert log_of(job, rank=1).strip() == "rank=1 of 2 on 1"


def test_processes_are_detached_and_read_back_by_a_new_backend(submit):
    job = submit("bob", command="sleep 600")
    run_until(job, {Phase.RUNNING})
    pid = runner_pid(job)
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    assert int(fields[1]) != os.getpid()  # not our child: survives the web server
    assert int(fields[2]) == pid  # its own process group (cancel signals the group)
    get_backend.cache_clear()  # as after a restart: a new backend object reads state from disk
    seen = get_backend().observe(job_id=job.pk, attempt_number=1, replicas=1)
    assert [s.state for s in seen] == ["running"]
    get_backend().stop(job_id=job.pk, attempt_number=1, replicas=1, force=True)


def test_ttl_deletes_working_dir_and_keeps_the_log(submit):
    job = submit("bob", command="echo kept > out.txt; echo logged", ttl_seconds_after_finished=60)
    run_until(job, {Phase.SUCCEEDED})
    work = get_backend().root / "work" / f"job-{job.pk}"
    assert (work / "attempt-1" / "replica-0" / "out.txt").exists()
    housekeeping(now=job.finished_at + timedelta(seconds=30))
    assert work.exists()
    housekeeping(now=job.finished_at + timedelta(seconds=61))
    assert not work.exists()
    assert log_of(job).strip() == "logged"
    job.refresh_from_db()
    assert job.cleaned_at is not None


def test_high_priority_preempts_a_low_priority_preemptible_job_which_runs_again(submit):
    low = submit("bob", "gpu-4", command="echo attempt $JOB_ATTEMPT; sleep 600", preemptible=True, priority=0)
    run_until(low, {Phase.RUNNING})
    high = submit("pan", "gpu-4", command="sleep 1", priority=100)
    tick()
    low.refresh_from_db()
    high.refresh_from_db()
    assert low.phase in (Phase.TERMINATING, Phase.PENDING) and low.reason == "Preempted"
    preempted = low.events.get(reason="Preempted")
    assert f"preempted by job #{high.pk}" in preempted.message and "priority high" in preempted.message
    assert (high.phase, high.reason) == (Phase.PENDING, "Preempting")
    run_until(high, {Phase.RUNNING, Phase.SUCCEEDED}, timeout=20)
    low.refresh_from_db()
    assert low.phase == Phase.PENDING and low.attempts.get(number=1).outcome == "Preempted"
    run_until(low, {Phase.RUNNING}, timeout=30)  # back once the high job is done
    assert low.current_attempt.number == 2
    assert "Preempting" in high.events.values_list("reason", flat=True)
    from jobs.services import job_cancel

    job_cancel(job=low, by=low.user)
    tick()


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_passes_never_over_commit(submit):
    if connection.vendor != "postgresql":
        pytest.skip("row locks are a PostgreSQL matter")
    jobs = [submit(u, "gpu-2", command="true") for u in ("bob", "pan", "lin")]
    barrier = threading.Barrier(2)
    errors = []

    def run():
        try:
            barrier.wait()
            schedule_pass()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    phases = sorted(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("phase", flat=True))
    assert phases == [Phase.PENDING, Phase.PREPARING, Phase.PREPARING]



# --- one attempt, one fate: a failed rank fails the attempt, which is retried whatever the timing -----------------


def run_attempts(job, attempts):
    """Run ``job`` through ``attempts`` failed attempts (moving the clock past each backoff) to its end."""
    for _ in range(attempts - 1):
        run_until(job, {Phase.BACKOFF, Phase.FAILED, Phase.SUCCEEDED})
        assert job.phase == Phase.BACKOFF, (job.phase, job.message)
        housekeeping(now=job.retry_at + timedelta(seconds=1))
    return run_until(job, {Phase.FAILED, Phase.SUCCEEDED})


def replica_pids(job, replicas=2):
    attempts = job.attempts.values_list("number", flat=True)
    return [runner_pid(job, attempt=a, rank=r) for a in attempts for r in range(replicas)]


@pytest.mark.parametrize("label, command, code, rank, note", [
    ("one rank fails early while the other runs",
     'if [ "$RANK" = 1 ]; then exit 5; fi; sleep 600', 5, 1, ""),
    # Rank 0 succeeds once rank 1 has reached it; rank 1 fails once rank 0 is gone. They meet on MASTER_ADDR:PORT
    # (127.0.0.1), as training ranks do: a sandboxed replica shares no file with another.
    ("one rank fails after the other succeeded",
     'if [ "$RANK" = 0 ]; then exec python3 -c "import os, socket; socket.create_server('
     '(os.environ[\'MASTER_ADDR\'], int(os.environ[\'MASTER_PORT\']))).accept()"; fi; '
     'until (: > "/dev/tcp/$MASTER_ADDR/$MASTER_PORT") 2>/dev/null; do sleep 0.05; done; '
     'while (: > "/dev/tcp/$MASTER_ADDR/$MASTER_PORT") 2>/dev/null; do sleep 0.05; done; exit 5', 5, 1, ""),
    ("one rank is killed by a signal",
     'if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 600', 137, 1, " (killed by SIGKILL)"),
])
def test_a_failed_rank_fails_the_attempt_which_is_retried(submit, tmp_path, label, command, code, rank, note):
    job = submit("bob", replicas=2, backoff_limit=2, command=command, env={"FLAGS": str(tmp_path)})
    run_attempts(job, 3)
    assert (job.phase, job.status, job.reason, job.exit_code) == (Phase.FAILED, "Fail", "Error", code)
    assert job.message == (f"Attempt 3 failed: rank {rank} exited with code {code}{note}; "
                           f"no retries left (backoff limit 2)")
    attempts = list(job.attempts.order_by("number"))
    assert [(a.outcome, a.exit_code, a.failed_rank) for a in attempts] == [("Error", code, rank)] * 3
    retries = list(job.events.filter(reason="Error").values_list("message", flat=True))
    assert f"Attempt 1 failed: rank {rank} exited with code {code}{note}; retry 1/2 in 10 s" in retries
    assert not any(alive(pid) for pid in replica_pids(job))  # the healthy rank was stopped each time


def test_ranks_failing_together_fail_the_attempt_once(submit):
    job = submit("bob", replicas=3, backoff_limit=1, command="exit 7")
    run_attempts(job, 2)
    assert (job.phase, job.exit_code, job.attempts.count()) == (Phase.FAILED, 7, 2)
    attempt = job.attempts.get(number=2)
    assert attempt.failed_rank in (0, 1, 2)
    assert job.message.startswith(f"Attempt 2 failed: rank {attempt.failed_rank} exited with code 7")


def test_every_rank_exiting_0_succeeds(submit):
    job = submit("bob", replicas=2, backoff_limit=2, command='sleep "0.$RANK"; exit 0')
    run_until(job, {Phase.SUCCEEDED, Phase.FAILED, Phase.BACKOFF})
    assert (job.phase, job.exit_code, job.message) == (Phase.SUCCEEDED, 0, "All replicas exited with code 0")
    assert job.attempts.get().failed_rank is None


# --- preemption that converges -----------------------------------------------------------------------------------


def test_reclaim_converges_the_owed_job_runs_and_the_borrower_is_evicted_once(submit, world):
    from jobs.models import GroupQuota

    GroupQuota.objects.filter(group=world.groups["phusers"], resource="gpu").update(limit=8)
    within = submit("bob", "gpu-4", command="sleep 600", preemptible=True)
    borrower = submit("pan", "gpu-4", command="sleep 600", preemptible=True)
    run_until(within, {Phase.RUNNING})
    run_until(borrower, {Phase.RUNNING})
    assert borrower.over_quota and not within.over_quota
    owed = submit("lin", "gpu-4", group="research", command="sleep 600")
    run_until(owed, {Phase.RUNNING}, timeout=30)
    for _ in range(5):  # pass after pass: nothing moves any more
        tick()
    for job in (within, borrower, owed):
        job.refresh_from_db()
    assert (within.phase, owed.phase, borrower.phase) == (Phase.RUNNING, Phase.RUNNING, Phase.PENDING)
    assert borrower.attempts.count() == 1 and borrower.events.filter(reason="Preempted").count() == 1
    assert f"preempted by job #{owed.pk}" in borrower.events.get(reason="Preempted").message
    assert "freed by the jobs it preempted" in owed.events.get(reason="Admitted").message
    for job in (within, borrower, owed):
        services.job_cancel(job=job, by=job.user)
    run_until(owed, {Phase.CANCELLED})


def test_a_preempted_interactive_job_ends_preempted(submit):
    notebook = submit("bob", "gpu-4", command="sleep 600", preemptible=True, priority=0, job_type="interactive")
    run_until(notebook, {Phase.RUNNING})
    high = submit("pan", "gpu-4", command="sleep 600", priority=100)
    run_until(notebook, {Phase.PREEMPTED, Phase.PENDING}, timeout=30)
    assert (notebook.phase, notebook.status, notebook.reason) == (Phase.PREEMPTED, "Preempted", "Preempted")
    assert notebook.attempts.count() == 1
    run_until(high, {Phase.RUNNING})
    services.job_cancel(job=high, by=high.user)
    run_until(high, {Phase.CANCELLED})
