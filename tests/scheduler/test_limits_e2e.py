"""Resource limits of local replicas, end to end: real jobs in the bubblewrap sandbox, through the real backend, each
against one limit of its instance type (cpu-tiny: 0.5 CPU, 1 GiB). What a sandboxed job finds out it prints to its
log; what the test must watch (its cgroup) it reads from outside, once the job says it is under way."""

import logging
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from jobs import services
from jobs.choices import Phase
from scheduler.backend_factory import get_backend
from scheduler.backends import cgroups, limits
from scheduler.values import ReplicaState
from tests import waiting

from .conftest import wait_for

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

GIB, MIB = 1024**3, 1024**2
ENDED = {Phase.SUCCEEDED, Phase.FAILED}
DEADLINE = 120.0  # seconds: generous, for a busy 2-core machine


def _usable() -> str:
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    missing = cgroups.detect(f"jobsite-probe-{os.getpid()}").missing
    return f"cgroup controllers not usable here: {missing}" if missing else ""


UNUSABLE = _usable()
pytestmark.append(pytest.mark.skipif(bool(UNUSABLE), reason=UNUSABLE or "-"))


def log_of(job, rank=0) -> str:
    return get_backend().log_path(job_id=job.pk, attempt_number=1, rank=rank).read_text()


def work_dir(job) -> Path:
    return get_backend().root / "work" / f"job-{job.pk}" / "attempt-1" / "replica-0"


def leaves(job) -> dict[str, Path]:
    """Controller → the directory of the job's replica 0 in its hierarchy."""
    name = cgroups.leaf_name(job.pk, 1, 0)
    return {c: Path(parent) / name for c, _, parent in get_backend().limits.parents}


def version() -> int:
    return get_backend().limits.parents[0][1]


def own_oom_kills() -> int:
    """OOM kills in this test process's own memory cgroup (not its children's)."""
    mounts = cgroups.parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    own = cgroups.parse_self_cgroup(Path("/proc/self/cgroup").read_text())
    mount = next((m for m in mounts if "memory" in m.controllers), None)
    if mount is not None:
        text = (cgroups.own_dir(mount, own["memory"]) / "memory.oom_control").read_text()
    else:
        mount = next(m for m in mounts if m.version == 2)
        text = (cgroups.own_dir(mount, own[""]) / "memory.events.local").read_text()
    return int(re.search(r"^oom_kill (\d+)$", text, re.M).group(1))


def test_a_job_over_its_memory_is_oom_killed_and_the_server_is_not(submit, clock):
    before = own_oom_kills()
    job = submit("bob", "cpu-tiny", backoff_limit=0,
                 command="python3 -c \"a = b'x' * (2 * 1024**3); print('survived')\"")
    wait_for(job, ENDED, clock, timeout=DEADLINE)
    # As Kubernetes tells a container the kernel killed: exit code 137, OOMKilled, counted against the backoff limit.
    assert (job.phase, job.status, job.reason, job.exit_code) == (Phase.FAILED, "Fail", "OOMKilled", 137), job.message
    assert "(OOMKilled, killed by SIGKILL)" in job.message
    [seen] = get_backend().observe(job_id=job.pk, attempt_number=1, replicas=1)
    assert (seen.state, seen.status, seen.exit_code) == (ReplicaState.EXITED, "OOMKilled", 137)
    assert "memory limit of 1 GiB" in seen.message
    assert job.events.filter(message__contains="OOMKilled", type="Warning").exists()
    assert "survived" not in log_of(job)
    assert not any(leaf.exists() for leaf in leaves(job).values())  # removed by its supervisor
    # The server: no OOM kill of its own, and the next job runs.
    assert own_oom_kills() == before
    after = submit("bob", "cpu-tiny", command="python3 -c \"a = b'x' * (256 * 1024**2); print('fine')\"")
    wait_for(after, ENDED, clock, timeout=DEADLINE)
    assert (after.phase, log_of(after)) == (Phase.SUCCEEDED, "fine\n")


FORK_COUNT = """python3 -c '
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as exc:
    print("fork failed after", n, exc.errno)
'"""


def test_a_fork_bomb_stops_at_the_process_limit(submit, clock, act, world, settings):
    settings.JOBSITE_LOCAL_PIDS_MAX = 64
    settings.JOBSITE_TERMINATION_GRACE_SECONDS = 1
    counted = submit("bob", "cpu-tiny", command=FORK_COUNT)
    wait_for(counted, ENDED, clock, timeout=DEADLINE)
    found = re.search(r"fork failed after (\d+) (\d+)", log_of(counted))
    assert counted.phase == Phase.SUCCEEDED and found, log_of(counted)
    assert 0 < int(found.group(1)) < 64 and int(found.group(2)) == 11  # EAGAIN

    bomb = submit("bob", "cpu-tiny", command="touch up; :(){ :|:& };:; sleep 600")
    wait_for(bomb, {Phase.RUNNING}, clock, timeout=DEADLINE)
    waiting.wait_for(lambda: (work_dir(bomb) / "up").exists(), timeout=DEADLINE, message="the bomb's up file")
    pids = leaves(bomb)["pids"]
    # It runs into the limit (the kernel counts each refused fork) and never past it.
    waiting.wait_for(lambda: int(dict(line.split() for line in (pids / "pids.events").read_text().splitlines())
                         .get("max", 0)) > 0, timeout=DEADLINE, message="a fork refused at pids.max")
    assert int((pids / "pids.current").read_text()) <= 64
    assert subprocess.run(["true"], timeout=30).returncode == 0  # the machine still forks
    act(services.job_cancel, job=bomb, by=world.users["bob"])
    wait_for(bomb, {Phase.CANCELLED}, clock, timeout=DEADLINE)
    waiting.wait_for(lambda: not pids.exists(), timeout=DEADLINE, message="the replica's pids cgroup removed")


CPU_HOG = """touch up; python3 -c '
import multiprocessing as mp, os, time
def spin():
    end = time.monotonic() + 4
    while time.monotonic() < end:
        pass
start = time.monotonic()
workers = [mp.Process(target=spin) for _ in range(2)]
for w in workers:
    w.start()
for w in workers:
    w.join()
used = os.times()
print("cpu %.2f" % ((used.children_user + used.children_system) / (time.monotonic() - start)))
'"""


def test_a_cpu_hog_gets_its_half_cpu(submit, clock, settings):
    settings.JOBSITE_LOCAL_PIDS_MAX = 100
    job = submit("bob", "cpu-tiny", command=CPU_HOG)
    wait_for(job, {Phase.RUNNING, *ENDED}, clock, timeout=DEADLINE)
    waiting.wait_for(lambda: (work_dir(job) / "up").exists(), timeout=DEADLINE, message="the job's up file")
    files = leaves(job)
    expect = ({"memory": ("memory.limit_in_bytes", str(GIB)), "cpu": ("cpu.cfs_quota_us", "50000"),
               "pids": ("pids.max", "100")} if version() == 1 else
              {"memory": ("memory.max", str(GIB)), "cpu": ("cpu.max", "50000 100000"), "pids": ("pids.max", "100")})
    assert {c: (f, (files[c] / f).read_text().strip()) for c, (f, _) in expect.items()} == expect
    wait_for(job, ENDED, clock, timeout=DEADLINE)
    share = float(re.search(r"cpu (\d+\.\d+)", log_of(job)).group(1))
    assert job.phase == Phase.SUCCEEDED and 0.05 < share < 0.75, log_of(job)  # two spinning processes, 0.5 CPU


def test_a_job_over_its_disk_bound_is_evicted(submit, clock, settings):
    settings.JOBSITE_LOCAL_DISK_BYTES, settings.JOBSITE_LOCAL_DISK_CHECK_SECONDS = 16 * MIB, 0.5
    many = submit("bob", "cpu-tiny", command="for i in $(seq 8); do head -c 4M /dev/zero > f$i; done; "
                                             "touch written; sleep 600")
    wait_for(many, ENDED, clock, timeout=DEADLINE)
    # As the kubelet evicts a pod over its ephemeral storage limit: FAILED at once, no retry.
    assert (many.phase, many.reason) == (Phase.FAILED, "Evicted"), many.message
    assert re.match(r"Working directory usage \(\d+(\.\d)? MiB\) exceeds its limit of 16 MiB", many.message)
    assert "given up" not in many.message  # ended at once: nothing of it was left to stop
    assert many.events.filter(reason="Evicted", type="Warning").exists()
    assert (work_dir(many) / "written").exists()

    big = submit("bob", "cpu-tiny", command="head -c 32M /dev/zero > big")  # one file: RLIMIT_FSIZE (SIGXFSZ)
    wait_for(big, ENDED, clock, timeout=DEADLINE)
    assert (big.phase, big.reason) == (Phase.FAILED, "Evicted"), big.message
    assert "reached its working directory's limit of 16 MiB" in big.message
    assert (work_dir(big) / "big").stat().st_size == 16 * MIB


def test_cleanup_removes_the_cgroup_a_dead_supervisor_left(submit, clock):
    job = submit("bob", "cpu-tiny", command="touch up; exec sleep 600")
    wait_for(job, {Phase.RUNNING}, clock, timeout=DEADLINE)
    waiting.wait_for(lambda: (work_dir(job) / "up").exists(), timeout=DEADLINE, message="the job's up file")
    backend = get_backend()
    state = backend.root / "state" / f"job-{job.pk}" / "attempt-1" / "replica-0"
    os.kill(int((state / "runner.pid").read_text().split()[0]), signal.SIGKILL)
    memory = leaves(job)["memory"]
    # The sandbox died with it: an empty cgroup left.
    waiting.wait_for(lambda: not cgroups.members(memory), timeout=DEADLINE, message="an empty memory cgroup")
    assert memory.exists()
    backend.cleanup(job_id=job.pk, attempt_number=1, replicas=1)
    assert not any(leaf.exists() for leaf in leaves(job).values())


# --- the setting ----------------------------------------------------------------------------------------------------


@pytest.fixture
def without(monkeypatch, tmp_path):
    """A machine whose cgroup hierarchies lack the controllers given (its mountinfo without them)."""

    def drop(*controllers):
        text = "".join(line + "\n" for line in Path("/proc/self/mountinfo").read_text().splitlines()
                       if not any(f",{c}" in line.split(" - ")[-1] for c in controllers))
        fake = tmp_path / "mountinfo"
        fake.write_text(text)
        real = cgroups.detect
        monkeypatch.setattr(limits.cgroups, "detect", lambda name, **kw: real(name, mountinfo=str(fake), **kw))

    return drop


def test_required_limits_refuse_to_start_without_a_controller(settings, without):
    without("pids")
    settings.JOBSITE_LOCAL_LIMITS = "require"
    get_backend.cache_clear()
    with pytest.raises(ImproperlyConfigured, match=r"JOBSITE_LOCAL_LIMITS=require, but the cgroup controller\(s\) "
                                                   r"pids cannot be used \(pids: no cgroup hierarchy of this machine "
                                                   r"offers it\), so jobs run without a process-count limit: the "
                                                   r"scheduler does not start"):
        get_backend("local")


def test_auto_without_a_controller_runs_and_says_so(submit, clock, settings, without, caplog):
    without("pids")
    get_backend.cache_clear()
    with caplog.at_level(logging.WARNING, logger="scheduler.backends.limits"):
        assert [c for c, _, _ in get_backend().limits.parents] == ["memory", "cpu"]
    assert "the cgroup controller(s) pids cannot be used" in caplog.text
    job = submit("bob", "cpu-tiny", command="echo ran")
    wait_for(job, ENDED, clock, timeout=DEADLINE)
    warning, ran = log_of(job).splitlines()
    assert warning.startswith("jobsite: WARNING: the cgroup controller(s) pids cannot be used") and ran == "ran"
    assert job.phase == Phase.SUCCEEDED


def test_a_supervisor_finds_its_replica_in_its_cgroup_without_reading_every_process(monkeypatch, tmp_path):
    """With a cgroup of its own, the replica's processes are the cgroup's members: one that dropped the replica's
    marker and is no descendant of the supervisor is found, and the machine's process table is never read (the
    supervisor looks while the sandbox starts, and again to sweep what the command left)."""
    from scheduler.backends import local_runner

    plan = cgroups.Plan(name=f"finder-test-{os.getpid()}", parents=get_backend().limits.parents)
    limiter = local_runner.Limiter(plan, tmp_path)
    assert limiter.create(open(os.devnull, "wb")) and limiter.cgroup is not None
    stray = subprocess.Popen(["env", "-i", "sleep", "600"], preexec_fn=limiter.enter, start_new_session=True)
    try:
        def no_table(*args, **kwargs):
            raise AssertionError("the process table was read")

        monkeypatch.setattr(local_runner, "processes", no_table)
        find = local_runner.finder("no-such-marker", limiter=limiter)
        assert [p.pid for p in find()] == [stray.pid]
        assert local_runner.sweep(find, grace=5) == []
        assert stray.wait(30) is not None and find() == []
    finally:
        stray.kill()
        limiter.end()
