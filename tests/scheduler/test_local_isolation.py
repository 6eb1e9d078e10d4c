"""Nothing outlives its attempt on the local backend: real processes, end to end.

A replica's processes are found by the marker they inherit (``JOBSITE_REPLICA``), whether their supervisor lives or
not; a stop kills them all, a replica is ``present`` (holds its GPUs) while any of them runs, a supervisor that never
starts is lost within a bound, and a stop that comes before the command starts keeps it from ever running.
Every command here writes the pids it wants watched into the test's own directory; only processes of this test's
backend root are ever signalled.

These are the replicas of JOBSITE_LOCAL_SANDBOX=off (unsandboxed: they can write into the test's directory, and
their pids are the machine's); test_sandbox.py replays them in the sandbox.
"""

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from jobs import services
from jobs.choices import RESOURCE_PHASES, Phase
from jobs.logs import replica_log_path
from jobs.models import Job
from scheduler.backend_factory import get_backend, local_backend
from scheduler.backends import local
from scheduler.backends.local import LocalBackend
from scheduler.launch import attempt_launch
from scheduler.passes import schedule_pass
from scheduler.sync import sync_jobs
from tests import waiting

from .conftest import wait_for

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _unsandboxed(settings):
    settings.JOBSITE_LOCAL_SANDBOX = "off"
    get_backend.cache_clear()


@pytest.fixture(autouse=True)
def _kill_what_this_test_started(tmp_path):
    """Whatever a test leaves running is killed at its end: each of its jobs has FLAGS=<its tmp_path> in its
    environment, which no process of another test has, and a process that dropped it wrote its pid there."""
    yield
    for pid_file in tmp_path.glob("*.pid"):
        if (left := Process(pid_file)).alive():
            os.kill(left.pid, signal.SIGKILL)
    own = f"FLAGS={tmp_path}".encode()
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and entry.stat().st_uid == os.getuid():
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    if own in f.read().split(b"\0"):
                        os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue


class Process:
    """A process a command told us about ("pid" or "pid starttime" in a file), told apart from any later one with
    the same pid by its start time."""

    def __init__(self, pid_file, timeout=10.0):
        waiting.wait_for(lambda: pid_file.exists() and pid_file.read_text().endswith("\n"), timeout=timeout,
                         interval=0.02, message=f"a pid in {pid_file}")
        pid, *start = pid_file.read_text().split()
        self.pid = int(pid)
        stat = self._stat() or [None] * 20  # gone already
        self.start = start[0] if start else stat[19]
        self.session = stat[3]

    def _stat(self):
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None

    def alive(self) -> bool:
        stat = self._stat()
        return stat is not None and stat[0] not in ("Z", "X") and stat[19] == self.start


def state_dir(job, attempt=1, rank=0):
    return get_backend().root / "state" / f"job-{job.pk}" / f"attempt-{attempt}" / f"replica-{rank}"


def runner_pid(job, attempt=1, rank=0):
    return int((state_dir(job, attempt, rank) / "runner.pid").read_text().split()[0])


# --- a replica whose supervisor is gone -------------------------------------------------------------------------


def test_a_lost_replicas_workload_is_killed_and_keeps_its_gpus_until_then(submit, clock, settings, tmp_path):
    settings.JOBSITE_LOCAL_GPUS = 4
    get_backend.cache_clear()
    job = submit("bob", "gpu-4", command='echo $$ > "$FLAGS/workload.pid"; exec sleep 600',
                 env={"FLAGS": str(tmp_path)})
    wait_for(job, {Phase.RUNNING}, clock)
    workload = Process(tmp_path / "workload.pid")
    # Another group's job that wants the GPUs the workload has.
    other = submit("lin", "gpu-4", group="research", command="sleep 600", env={"FLAGS": str(tmp_path)})
    clock()
    other.refresh_from_db()
    assert other.phase == Phase.PENDING

    os.kill(runner_pid(job), signal.SIGKILL)  # only the supervisor dies
    wait_for(job, {Phase.UNKNOWN}, clock)
    assert job.reason == "NodeUnresponsive" and "supervisor of replica 0" in job.message
    assert workload.alive()
    seen = get_backend().observe(job_id=job.pk, attempt_number=1, replicas=1)
    assert [(o.state, o.present) for o in seen] == [("lost", True)]  # its GPUs are not free

    later = timezone.now() + timedelta(seconds=settings.JOBSITE_NODE_LOST_GRACE_SECONDS + 1)
    clock(now=later)
    job.refresh_from_db()
    assert (job.phase, job.reason) == (Phase.TERMINATING, "NodeLost")
    deadline = time.monotonic() + 20
    while job.phase == Phase.TERMINATING or workload.alive():
        assert time.monotonic() < deadline, f"{job.phase}, workload alive: {workload.alive()}"
        clock(now=later)
        job.refresh_from_db()
        other.refresh_from_db()
        handed_on = other.phase in RESOURCE_PHASES or (job.current_attempt.number > 1
                                                       and job.phase in RESOURCE_PHASES)
        assert not (handed_on and workload.alive()), "the GPUs were handed on while the lost workload still ran"
        time.sleep(0.02)
    assert job.phase in (Phase.PENDING, Phase.PREPARING, Phase.RUNNING)  # requeued
    assert job.attempts.get(number=1).outcome == "NodeLost"
    lost = job.events.get(reason="NodeLost").message
    assert "the supervisor of replica 0 on local is gone; 1 of its processes still running" in lost


def test_cancel_from_unknown_kills_the_workload(submit, clock, act, world, tmp_path):
    job = submit("bob", command='trap "" TERM; echo $$ > "$FLAGS/workload.pid"; while :; do sleep 0.2; done',
                 env={"FLAGS": str(tmp_path)})
    wait_for(job, {Phase.RUNNING}, clock)
    workload = Process(tmp_path / "workload.pid")
    os.kill(runner_pid(job), signal.SIGKILL)
    wait_for(job, {Phase.UNKNOWN}, clock)
    assert workload.alive()
    act(services.job_cancel, job=job, by=world.users["bob"])
    wait_for(job, {Phase.CANCELLED}, clock)
    assert not workload.alive()
    last = job.events.last()
    assert (last.type, last.reason) == ("Normal", "Terminated")  # ended, not given up on


# --- a supervisor that never starts -------------------------------------------------------------------------------


@pytest.fixture
def vanishing_runner(monkeypatch, tmp_path):
    """The supervisor exits at once, before it writes its pid (as when it crashes on start)."""
    script = tmp_path / "vanishing_runner.py"
    script.write_text("raise SystemExit(0)\n")
    monkeypatch.setattr(local, "RUNNER", script)


def test_a_job_whose_supervisor_never_started_can_be_cancelled(submit, clock, act, world, vanishing_runner,
                                                               tmp_path):
    job = submit("bob", "gpu-1", command="sleep 600", env={"FLAGS": str(tmp_path)})
    wait_for(job, {Phase.PREPARING}, clock)
    clock()
    assert job.current_attempt.launched_at is not None and not (state_dir(job) / "runner.pid").exists()
    started = time.monotonic()
    act(services.job_cancel, job=job, by=world.users["bob"])
    wait_for(job, {Phase.CANCELLED}, clock, timeout=15)
    assert time.monotonic() - started < 15
    last = job.events.last()
    assert (last.type, last.reason) == ("Normal", "Terminated") and "given up" not in job.message


def test_a_supervisor_that_never_starts_is_lost_within_the_bound(submit, clock, settings, vanishing_runner,
                                                                 tmp_path):
    """Nothing of it is left, which the backend knows: no node-lost grace, the attempt is requeued at once (counted
    against the requeue limit: here none is left, so the job fails saying why)."""
    settings.JOBSITE_LOCAL_START_TIMEOUT_SECONDS = 1
    settings.JOBSITE_REQUEUE_LIMIT = 0
    job = submit("bob", "gpu-1", command="sleep 600", env={"FLAGS": str(tmp_path)})
    wait_for(job, {Phase.FAILED}, clock, timeout=15)
    assert job.reason == "RequeueLimitExceeded"
    event = job.events.get(reason="RequeueLimitExceeded")
    assert event.type == "Warning"
    assert "the supervisor of replica 0 on local never started" in event.message
    assert not job.events.filter(reason__in=["NodeUnresponsive", "Started"]).exists()


# --- cancelled before the launch ----------------------------------------------------------------------------------


class CancelledWhileLaunching(LocalBackend):
    """The job is cancelled, and the scheduler's sync stops its attempt, while its launch is on its way to the
    supervisor: the stop finds nothing running yet."""

    def launch(self, spec):
        job = Job.objects.get(pk=spec.job_id)
        services.job_cancel(job=job, by=job.user)
        sync_jobs(backend=self)
        return super().launch(spec)


def test_a_replica_stopped_before_its_command_started_never_runs_it(submit, clock, settings, tmp_path):
    backend = CancelledWhileLaunching(root=settings.JOBSITE_LOCAL_ROOT, log_layout=replica_log_path)
    job = submit("bob", "gpu-1", command='touch "$FLAGS/ran"; sleep 600', env={"FLAGS": str(tmp_path)})
    schedule_pass(backend=backend)  # admitted; its launch left to us
    attempt_launch(job.pk, backend=backend)
    # Its supervisor starts, finds the stop and records an end, before the rounds read it back (a round that looked
    # before the supervisor existed would rightly end the job without an exit code).
    waiting.wait_for(lambda: (state_dir(job) / "exit_code").exists(), timeout=30, interval=0.02,
                     message="its exit code")
    wait_for(job, {Phase.CANCELLED}, clock, backend=backend)
    assert not (tmp_path / "ran").exists()
    assert (state_dir(job) / "exit_code").exists()  # its supervisor ran, and recorded an end: it never will
    assert "stopped before the command started" in backend.log_path(job_id=job.pk, attempt_number=1,
                                                                     rank=0).read_text()
    # Nothing of it was launched when the cancel was synced: stopped at once (forced), before anything could start.
    assert job.exit_code == 128 + signal.SIGKILL


def test_a_job_cancelled_after_its_launch_was_claimed_starts_nothing(submit, clock, monkeypatch, tmp_path):
    job = submit("bob", "gpu-1", command='touch "$FLAGS/ran"; sleep 600', env={"FLAGS": str(tmp_path)})
    schedule_pass()
    claim = services.attempt_claim_launch

    def claim_then_cancelled(*, attempt, now=None):  # the cancel commits just after the launch was claimed
        claimed = claim(attempt=attempt, now=now)
        services.job_cancel(job=Job.objects.get(pk=attempt.job_id), by=job.user)
        return claimed

    monkeypatch.setattr(services, "attempt_claim_launch", claim_then_cancelled)
    attempt_launch(job.pk, backend=get_backend())
    wait_for(job, {Phase.CANCELLED}, clock)
    assert not (tmp_path / "ran").exists()
    assert not (state_dir(job) / "launched").exists() and not (state_dir(job) / "runner.pid").exists()


def test_a_job_cancelled_before_its_launch_was_claimed_ends(submit, clock, act, world, tmp_path):
    job = submit("bob", "gpu-1", command='touch "$FLAGS/ran"; sleep 600', env={"FLAGS": str(tmp_path)})
    schedule_pass()  # admitted: its after-commit launch has not run yet
    act(services.job_cancel, job=job, by=world.users["bob"])
    wait_for(job, {Phase.CANCELLED}, clock, timeout=30)
    assert not (tmp_path / "ran").exists()


# --- what a command leaves behind ----------------------------------------------------------------------------------


def test_a_background_child_left_by_a_finished_command_is_killed(submit, clock, tmp_path):
    # It writes the background child's pid and start time (field 22 of its stat) while the child surely lives.
    job = submit("bob", "gpu-1", env={"FLAGS": str(tmp_path)},
                 command='sleep 1000 & echo "$! $(cut -d" " -f22 /proc/$!/stat)" > "$FLAGS/bg.pid"; exit 0')
    wait_for(job, {Phase.SUCCEEDED, Phase.FAILED}, clock)
    assert (job.phase, job.exit_code) == (Phase.SUCCEEDED, 0)
    background = Process(tmp_path / "bg.pid")
    assert not background.alive()  # gone by the time the replica ended: its GPU held nothing afterwards


def test_a_child_that_dropped_its_environment_is_killed_when_the_command_ends(submit, clock, tmp_path):
    # No marker in its environment and an orphan once bash exits: the supervisor, its subreaper, still has it.
    job = submit("bob", env={"FLAGS": str(tmp_path)},
                 command='env -i sleep 1000 & echo "$! $(cut -d" " -f22 /proc/$!/stat)" > "$FLAGS/bg.pid"; exit 0')
    wait_for(job, {Phase.SUCCEEDED, Phase.FAILED}, clock)
    assert job.phase == Phase.SUCCEEDED
    assert not Process(tmp_path / "bg.pid").alive()


def test_cancel_kills_setsid_escapees_and_children_that_ignore_sigterm(submit, clock, act, world, settings,
                                                                      tmp_path):
    settings.JOBSITE_TERMINATION_GRACE_SECONDS = 1
    job = submit("bob", command=(
        "setsid bash -c 'echo $$ > \"$FLAGS/setsid.pid\"; exec sleep 1000' & "
        "bash -c 'trap \"\" TERM; echo $$ > \"$FLAGS/trap.pid\"; while :; do sleep 0.2; done' & "
        "sleep 1000"), env={"FLAGS": str(tmp_path)})
    wait_for(job, {Phase.RUNNING}, clock)
    escapee, stubborn = Process(tmp_path / "setsid.pid"), Process(tmp_path / "trap.pid")
    assert escapee.session != stubborn.session  # it left the replica's session and process group
    act(services.job_cancel, job=job, by=world.users["bob"])
    wait_for(job, {Phase.CANCELLED}, clock)
    assert not escapee.alive() and not stubborn.alive()


def test_an_escapee_of_a_lost_replica_is_killed_too(submit, clock, act, world, tmp_path):
    job = submit("bob", command="setsid bash -c 'echo $$ > \"$FLAGS/setsid.pid\"; exec sleep 1000' & sleep 1000",
                 env={"FLAGS": str(tmp_path)})
    wait_for(job, {Phase.RUNNING}, clock)
    escapee = Process(tmp_path / "setsid.pid")
    os.killpg(runner_pid(job), signal.SIGKILL)  # the supervisor and its process group: not the escapee
    wait_for(job, {Phase.UNKNOWN}, clock)
    assert escapee.alive()
    act(services.job_cancel, job=job, by=world.users["bob"])
    wait_for(job, {Phase.CANCELLED}, clock)
    assert not escapee.alive()


def test_another_installation_never_touches_these_processes(submit, clock, tmp_path):
    job = submit("bob", command='echo $$ > "$FLAGS/workload.pid"; exec sleep 600', env={"FLAGS": str(tmp_path)})
    wait_for(job, {Phase.RUNNING}, clock)
    workload = Process(tmp_path / "workload.pid")
    other = local_backend(root=tmp_path / "other-root")  # same job id, attempt and rank, another root
    other.stop(job_id=job.pk, attempt_number=1, replicas=1, force=True)
    assert [o.present for o in other.observe(job_id=job.pk, attempt_number=1, replicas=1)] == [False]
    assert workload.alive()
    assert [o.present for o in get_backend().observe(job_id=job.pk, attempt_number=1, replicas=1)] == [True]


def test_an_ended_replica_is_read_from_its_files_and_one_that_left_a_process_is_present(submit, clock, monkeypatch):
    """A replica whose supervisor killed all it left before writing the exit code is observed from its state files
    alone (the process table, a read of every process on the machine, is not needed); one whose sweep could not kill
    a process names it in ``left``, and is seen present while that process lives."""
    job = submit("bob", command="true")
    wait_for(job, {Phase.SUCCEEDED}, clock)
    state = state_dir(job)
    assert (state / "exit_code").exists() and not (state / local.LEFT_FILE).exists()

    def no_table(*args, **kwargs):
        raise AssertionError("the process table was read")

    with monkeypatch.context() as patched:
        patched.setattr(local, "processes", no_table)
        assert [(o.state, o.present) for o in get_backend().observe(job_id=job.pk, attempt_number=1, replicas=1)] \
            == [("exited", False)]

    stuck = subprocess.Popen(["sleep", "600"], env={**os.environ, local.MARKER: get_backend().marker(job.pk, 1, 0)})
    try:
        (state / local.LEFT_FILE).write_text(str(stuck.pid))
        assert [(o.state, o.present) for o in get_backend().observe(job_id=job.pk, attempt_number=1, replicas=1)] \
            == [("exited", True)]
    finally:
        stuck.kill()
        stuck.wait()


def test_the_sweep_names_what_it_could_not_kill(monkeypatch):
    """A process the kill cannot end (stuck in the kernel; here: signals that reach nothing) is what the sweep
    returns, for its supervisor to write in ``left``; nothing is returned when all ended."""
    from scheduler.backends import local_runner

    marker = "sweep-test:1:1:0"
    stuck = subprocess.Popen(["sleep", "600"], env={**os.environ, local_runner.MARKER: marker})
    try:
        monkeypatch.setattr(local_runner, "KILL_WAIT_SECONDS", 0.2)
        find = local_runner.finder(marker)  # no cgroup: by the marker, from the process table
        with monkeypatch.context() as patched:
            patched.setattr(local_runner, "send_all", lambda procs, sig: None)
            assert [p.pid for p in local_runner.sweep(find, grace=0.1)] == [stuck.pid]
        assert local_runner.sweep(find, grace=5) == []  # signals that reach it: it ended (and was reaped)
        assert local_runner.live_process(stuck.pid) is None
    finally:
        stuck.kill()
        stuck.wait()


# --- the scheduler killed as it launches ------------------------------------------------------------------------

LAUNCHER = """
import os, sys
import django
django.setup()
from scheduler.values import LaunchReplica, LaunchSpec
from scheduler.backend_factory import local_backend
backend = local_backend(root=sys.argv[1], gpus=1)
backend.launch(LaunchSpec(job_id=1, attempt_id=1, attempt_number=1, image="", command=sys.argv[2],
                          replicas=[LaunchReplica(rank=0, node="local", gpu_ids=(0,), env={"FLAGS": sys.argv[3]})]))
print("launched", flush=True)
sys.stdin.read()  # until killed
"""


def test_a_scheduler_killed_with_its_process_group_right_after_a_launch_kills_no_replica(tmp_path):
    """The scheduler's whole process group is killed the moment its launch returns, while the supervisor it started
    is still starting its interpreter: the supervisor is its own session from its first instruction, so the replica
    runs to its end (issue 21.1: it used to die with the group and hold its GPUs until the node-lost grace)."""
    root = tmp_path / "root"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "jobsite.settings", "JOBSITE_LOCAL_SANDBOX": "off",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'unused.sqlite3'}", "LOG_LEVEL": "WARNING"}
    env.pop("REDIS_URL", None)
    scheduler = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(root), "echo ran to the end", str(tmp_path)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True,
                                 cwd=str(django_settings.BASE_DIR))
    try:
        assert scheduler.stdout.readline() == b"launched\n"
        os.killpg(scheduler.pid, signal.SIGKILL)  # the scheduler and everything still in its process group
    finally:
        scheduler.kill()
        scheduler.wait()
    state = root / "state" / "job-1" / "attempt-1" / "replica-0"
    waiting.wait_for(lambda: (state / "exit_code").exists(), timeout=60, interval=0.02,
                     message="the replica's exit code (did it die with the scheduler?)")
    assert (state / "exit_code").read_text() == "0"
    assert (root / "logs" / "job-1" / "attempt-1" / "replica-0.log").read_text() == "ran to the end\n"
