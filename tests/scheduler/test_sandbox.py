"""Job isolation on the local backend: the sandbox's command line (a table), the setting's three modes, and the
takeover attempts of a hostile job replayed through the real backend (each must fail).

A sandboxed job sees no file of the test, so what it finds out it prints to its log, and what the test must watch
(its PID namespace) it writes into its own working directory, which the test reads from outside.
"""

import logging
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from rest_framework.test import APIClient

from jobs import services
from jobs.choices import Phase
from scheduler.backend_factory import get_backend
from scheduler.backends import sandbox
from scheduler.backends.local_runner import MARKER, processes, replica_processes
from scheduler.backends.sandbox import SETPRIV, SHIM_BIN, Facts, sandbox_argv, sandbox_env
from scheduler.values import LaunchReplica, LaunchSpec, ReplicaState
from tests import waiting

from .conftest import wait_for

pytestmark = [pytest.mark.fast, pytest.mark.django_db]

BWRAP = shutil.which("bwrap")
needs_bwrap = pytest.mark.skipif(BWRAP is None, reason="bubblewrap (bwrap) is not installed: apt-get install "
                                                       "bubblewrap (make services installs it)")

# --- the command line -----------------------------------------------------------------------------------------------

DEBIAN = (("/usr", ""), ("/bin", "usr/bin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64"), ("/etc", ""))
WORK = "/srv/var/local/work/job-7/attempt-1/replica-0"


def facts(**kw) -> Facts:
    return Facts(**{"bwrap": "/usr/bin/bwrap", "work_dir": WORK, "command": ["/bin/bash", "-c", "true"],
                    "system": DEBIAN, **kw})


def pairs(argv, option):
    """The (source, destination) of every ``option`` in argv."""
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == option]


@pytest.mark.parametrize("label, f, expect", [
    ("a server that is not root: a user namespace, the job as uid/gid 65534",
     facts(), {"userns": ["--unshare-user", "--uid", "65534", "--gid", "65534"], "setpriv": False}),
    ("a root server: bwrap as root, then setpriv to the unprivileged user with no capabilities",
     facts(privileged=True, uid=1234, gid=4321), {"userns": [], "setpriv": True}),
])
def test_the_sandbox_command_line(label, f, expect):
    argv = sandbox_argv(f)
    assert argv[0] == "/usr/bin/bwrap"
    for option in ("--die-with-parent", "--unshare-pid", "--unshare-ipc", "--new-session"):
        assert option in argv, (label, option)
    # Not bubblewrap's: the replica is started inside its attempt's network namespace (netns.py), shared by ranks.
    assert "--unshare-net" not in argv and "--share-net" not in argv
    assert ("--unshare-user" in argv) == bool(expect["userns"])
    if expect["userns"]:
        i = argv.index("--unshare-user")
        assert argv[i:i + 5] == expect["userns"]
    # The system read-only, Debian's links recreated as links; private /proc, /dev, /tmp.
    assert ("/usr", "/usr") in pairs(argv, "--ro-bind") and ("/etc", "/etc") in pairs(argv, "--ro-bind")
    assert ("usr/bin", "/bin") in pairs(argv, "--symlink") and ("usr/lib64", "/lib64") in pairs(argv, "--symlink")
    assert [argv[i - 2:i + 2] for i, a in enumerate(argv) if a == "--tmpfs"] == [
        ["--perms", "1777", "--tmpfs", p] for p in ("/tmp", "/var/tmp", "/dev/shm")]
    assert "--proc" in argv and "--dev" in argv
    # Writable: only the working directory (last, over anything else), where the command starts.
    assert pairs(argv, "--bind") == [(WORK, WORK)]
    assert argv[argv.index("--chdir") + 1] == WORK
    if expect["setpriv"]:
        i = argv.index(SETPRIV)
        assert argv[i - 1] == "--" and argv[i:i + 9] == [
            SETPRIV, "--reuid", "1234", "--regid", "4321", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--"]
        assert [argv[i + 1] for i, a in enumerate(argv) if a == "--cap-add"] == ["CAP_SETUID", "CAP_SETGID",
                                                                                 "CAP_SETPCAP"]
    else:
        assert SETPRIV not in argv and "--cap-add" not in argv
    assert argv[-3:] == ["/bin/bash", "-c", "true"]


def test_datasets_group_volume_gpus_and_the_hostfile_are_the_only_other_paths():
    argv = sandbox_argv(facts(readonly=("/datasets/imagenet", "/srv/var/local/work/job-7/attempt-1/hostfile"),
                              writable=("/volumes/research",),
                              devices=(("/dev/nvidia0", "/dev/nvidia0"), ("/dev/nvidiactl", "/dev/nvidiactl"))))
    assert pairs(argv, "--ro-bind")[-2:] == [("/datasets/imagenet", "/datasets/imagenet"),
                                             ("/srv/var/local/work/job-7/attempt-1/hostfile",) * 2]
    assert pairs(argv, "--bind") == [("/volumes/research", "/volumes/research"), (WORK, WORK)]
    assert pairs(argv, "--dev-bind") == [("/dev/nvidia0", "/dev/nvidia0"), ("/dev/nvidiactl", "/dev/nvidiactl")]
    shown = {p for option in ("--ro-bind", "--bind", "--dev-bind") for p, _ in pairs(argv, option)}
    assert not any(p.startswith("/srv/var/local/") and p not in (WORK, f"{Path(WORK).parent}/hostfile")
                   for p in shown)  # no other job's directory, no log, no state


def test_an_installation_under_a_shown_directory_is_hidden_but_the_working_directory_and_examples_show():
    work = "/opt/jobsite/var/local/work/job-7/attempt-1/replica-0"
    argv = sandbox_argv(facts(
        system=(*DEBIAN, ("/opt", "")), work_dir=work,
        readonly=("/opt/jobsite/examples", "/opt/jobsite/var/local/work/job-7/attempt-1/hostfile"),
        hidden=("/opt/jobsite", "/opt/jobsite/var", "/opt/jobsite/var/local", "/srv/elsewhere")))
    mounts = argv[argv.index("/dev/shm") + 1:argv.index("--chdir")]
    parents = ["/opt/jobsite/var", "/opt/jobsite/var/local", "/opt/jobsite/var/local/work",
               "/opt/jobsite/var/local/work/job-7", "/opt/jobsite/var/local/work/job-7/attempt-1"]
    assert mounts == [
        "--tmpfs", "/opt/jobsite",  # the code and var/ as an empty directory, then what shows of them
        "--ro-bind", "/opt/jobsite/examples", "/opt/jobsite/examples",
        *[a for p in parents for a in ("--dir", p)],
        "--ro-bind", "/opt/jobsite/var/local/work/job-7/attempt-1/hostfile",
        "/opt/jobsite/var/local/work/job-7/attempt-1/hostfile",
        "--bind", work, work]
    f = facts(system=(*DEBIAN, ("/opt", "")), hidden=("/opt/jobsite",), readonly=("/opt/jobsite/examples",))
    env = sandbox_env({"PATH": "/opt/jobsite/.venv/bin:/opt/jobsite/examples/bin:/opt/conda/bin"}, f)
    assert env["PATH"] == "/opt/jobsite/examples/bin:/opt/conda/bin"


@pytest.mark.parametrize("label, path, shim, expect", [
    ("the server's virtualenv and home are not there",
     "/work/main/.venv/bin:/root/.pyenv/shims:/usr/local/bin:/usr/bin:/bin", "", "/usr/local/bin:/usr/bin:/bin"),
    ("nothing visible: the default", "/root/bin", "", "/usr/local/bin:/usr/bin:/bin"),
    ("software the sandbox shows stays", "/opt/conda/bin:/usr/bin", "", "/opt/conda/bin:/usr/bin"),
    ("no python on the system: python3 under that name", "/usr/bin", "/usr/bin/python3", f"/usr/bin:{SHIM_BIN}"),
])
def test_path_keeps_what_the_sandbox_shows(label, path, shim, expect):
    f = facts(system=(*DEBIAN, ("/opt", "")), python_shim=shim)
    env = sandbox_env({"PATH": path, "RANK": "0", MARKER: "x:1:1:0"}, f)
    assert env == {"PATH": expect, "RANK": "0", MARKER: "x:1:1:0"}, label
    assert (f"{SHIM_BIN}/python" in sandbox_argv(f)) == bool(shim)


# --- the setting --------------------------------------------------------------------------------------------------


@pytest.fixture
def no_bwrap(monkeypatch, tmp_path):
    """A machine without bubblewrap: nothing on PATH."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def test_required_sandbox_without_bwrap_refuses_to_start(settings, no_bwrap):
    settings.JOBSITE_LOCAL_SANDBOX = "bwrap"
    get_backend.cache_clear()
    with pytest.raises(ImproperlyConfigured, match=r"JOBSITE_LOCAL_SANDBOX=bwrap, but bubblewrap \(bwrap\) is not "
                                                   r"on PATH: the scheduler does not start"):
        get_backend("local")


def test_an_unknown_mode_is_refused(settings):
    settings.JOBSITE_LOCAL_SANDBOX = "maybe"
    with pytest.raises(ImproperlyConfigured, match="must be one of auto, bwrap, off, not 'maybe'"):
        sandbox.resolve_mode()


# --- real jobs ----------------------------------------------------------------------------------------------------


def log_of(job, attempt=1, rank=0) -> str:
    return get_backend().log_path(job_id=job.pk, attempt_number=attempt, rank=rank).read_text()


def work_dir(job, attempt=1, rank=0) -> Path:
    return get_backend().root / "work" / f"job-{job.pk}" / f"attempt-{attempt}" / f"replica-{rank}"


def in_namespace(ns: str) -> list[int]:
    """Every live process of the machine in the PID namespace ``ns`` ("pid:[inode]")."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and os.readlink(f"/proc/{entry.name}/ns/pid") == ns:
                with open(f"/proc/{entry.name}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                        found.append(int(entry.name))
        except OSError:
            continue
    return found


def namespace_of(job) -> str:
    """The PID namespace the job wrote into its working directory (``readlink /proc/self/ns/pid > ns``)."""
    ns_file = work_dir(job) / "ns"
    waiting.wait_for(lambda: ns_file.exists() and ns_file.read_text().endswith("\n"),
                     message=lambda: f"the job's PID namespace in {ns_file}; its log: {log_of(job)}")
    return ns_file.read_text().strip()


@needs_bwrap
@pytest.mark.slow
def test_a_normal_job_works_in_the_sandbox(submit, clock, world, settings):
    assert get_backend().bwrap
    job = submit("bob", "gpu-2", replicas=2, command=(
        'echo "rank $RANK of $WORLD_SIZE at $MASTER_ADDR:$MASTER_PORT gpus=$CUDA_VISIBLE_DEVICES user=$(id -u)"; '
        'python -c "print(6 * 7)"; python3 -c "import sys; print(sys.version_info[0])"; '
        'bash -c "sleep 0.1; echo slept"; echo result > out.txt; head -c 9 "$JOB_HOSTFILE"; echo; '
        'echo t > /tmp/t && echo s > /dev/shm/s && cat /tmp/t /dev/shm/s; '
        'python3 -c "import multiprocessing as m; q = m.Queue(); m.Process(target=q.put, args=(5,)).start(); '
        'print(q.get())"; '
        'test "$RANK" = 1 && exit 3; exit 0'), backoff_limit=0)
    wait_for(job, {Phase.SUCCEEDED, Phase.FAILED}, clock)
    assert (job.phase, job.exit_code, job.attempts.get().failed_rank) == (Phase.FAILED, 3, 1)
    for rank in (0, 1):
        assert (work_dir(job, rank=rank) / "out.txt").read_text() == "result\n"
        out = log_of(job, rank=rank)
        assert f"rank {rank} of 2 at 127.0.0.1:" in out and f"user={settings.JOBSITE_LOCAL_SANDBOX_UID}" in out
        assert "\n42\n3\nslept\n127.0.0.1\nt\ns\n5\n" in out, out
    client = APIClient()
    client.force_authenticate(world.users["bob"])
    shown = client.get(f"/api/v1/jobs/{job.pk}/logs/", {"replica": 1})
    text = b"".join(shown.streaming_content) if shown.streaming else shown.content
    assert shown.status_code == 200 and b"rank 1 of 2" in text


@needs_bwrap
@pytest.mark.slow
def test_the_takeover_attempts_of_a_hostile_job_all_fail(submit, clock, settings, tmp_path):
    """A job of lin's against bob's running job, the installation's files and the server itself (issue 14)."""
    root = get_backend().root
    database = root.parent / "jobsite.sqlite3"  # where the embedded default keeps its database: beside local/
    database.write_text("API tokens and password hashes")
    victim = submit("bob", command='echo "bob secret log"; echo "bob secret" > secret.txt; '
                                   'readlink /proc/self/ns/pid > ns; exec sleep 600')
    wait_for(victim, {Phase.RUNNING}, clock)
    victim_ns = namespace_of(victim)
    assert victim_ns != os.readlink("/proc/self/ns/pid")  # before anything is signalled: only the victim's
    victim_pids = in_namespace(victim_ns)
    assert victim_pids
    code = Path(django_settings.BASE_DIR)
    victim_state = root / "state" / f"job-{victim.pk}" / "attempt-1" / "replica-0"
    planted = code / "jobs" / f"planted_by_test_{os.getpid()}.py"
    steps = {
        "read the database": f'cat "{database}"',
        "list the installation": f'ls "{root}/work" "{root}/logs" "{root}/state"',
        "read another job's file": f'cat "{work_dir(victim)}/secret.txt"',
        "read another job's log": f'cat "{root}/logs/job-{victim.pk}/attempt-1/replica-0.log"',
        "truncate another job's log": f': > "{root}/logs/job-{victim.pk}/attempt-1/replica-0.log"',
        "read the code": f'cat "{code}/jobsite/settings.py"',
        "write into the code": f'touch "{planted}"',
        "forge another job's exit": f'echo 0 > "{victim_state}/exit_code"',
        "forge its own exit": f'echo 0 > "{root}/state/job-$JOB_ID/attempt-1/replica-0/exit_code"',
        # Never a broad kill here (kill -1): should the sandbox fail, it would reach every process of the machine.
        "signal the server": f"kill -0 {os.getpid()}",
        "kill another job": "kill -9 " + " ".join(map(str, victim_pids)),
        "see another job's process": "for p in /proc/[0-9]*; do "
                                     "[ \"$(tr '\\0' ' ' < $p/cmdline)\" = 'sleep 600 ' ] && exit 0; done; exit 1",
        "read the machine's passwords": "cat /etc/shadow",
    }
    script = "".join(f'if ( {cmd} ) >/dev/null 2>&1; then echo "ALLOWED: {name}"; else echo "denied: {name}"; fi\n'
                     for name, cmd in steps.items())
    attacker = submit("lin", group="research", backoff_limit=0, command=script)
    try:
        wait_for(attacker, {Phase.SUCCEEDED, Phase.FAILED}, clock)
        out = log_of(attacker)
        assert [line for line in out.splitlines() if line.startswith(("denied", "ALLOWED"))] == [
            f"denied: {name}" for name in steps], out
        victim.refresh_from_db()
        assert victim.phase == Phase.RUNNING and in_namespace(victim_ns) == victim_pids
        assert log_of(victim) == "bob secret log\n" and not (victim_state / "exit_code").exists()
        assert not planted.exists()
        assert "bob secret" not in out and "API tokens" not in out
    finally:
        planted.unlink(missing_ok=True)


@needs_bwrap
@pytest.mark.slow
def test_an_installation_inside_a_shown_directory_stays_hidden(submit, clock, settings, tmp_path):
    shown = tmp_path / "shown"  # e.g. /opt, holding var/ (the database, the local root)
    var = shown / "var"
    var.mkdir(parents=True)
    for d in (shown, var):
        d.chmod(0o755)
    (var / "jobsite.sqlite3").write_text("API tokens and password hashes")
    (var / "jobsite.sqlite3").chmod(0o644)  # anyone on the machine may read it: the sandbox must hide it
    settings.VAR_DIR, settings.JOBSITE_LOCAL_ROOT = var, var / "local"
    get_backend.cache_clear()
    code = Path(settings.BASE_DIR)
    settings.JOBSITE_LOCAL_SANDBOX_PATHS = [str(code.parent), str(shown), str(code / "examples")]
    # A checkout under /tmp shows /tmp, and with it pytest's own private (0700) directories above ``shown``: the
    # job must be able to pass through them, as through /opt's, for the test to mean anything.
    private = [p for p in (tmp_path, *tmp_path.parents) if p.is_relative_to(code.parent) and p != code.parent
               and not p.stat().st_mode & 0o001]
    for p in private:
        p.chmod(p.stat().st_mode | 0o001)
    try:
        job = submit("bob", command=f'ls "{code}" "{var}"; cat "{var}/jobsite.sqlite3" "{code}/jobsite/settings.py"; '
                                    f'echo written > out.txt; cat out.txt')
        wait_for(job, {Phase.SUCCEEDED, Phase.FAILED}, clock)
    finally:
        for p in private:
            p.chmod(p.stat().st_mode & ~0o001)
    out = log_of(job)
    assert f"{code}:\nexamples\n" in out and f"{var}:\nlocal\n" in out, out  # only what the job needs
    assert "API tokens" not in out and "SECRET_KEY" not in out and out.endswith("written\n")


@needs_bwrap
@pytest.mark.slow
def test_a_background_child_is_gone_when_the_command_exits_0(submit, clock):
    job = submit("bob", "gpu-1", command='readlink /proc/self/ns/pid > ns; sleep 1000 & '
                                         'until [ -e /proc/$!/stat ]; do :; done; echo "bg $!"; exit 0')
    wait_for(job, {Phase.SUCCEEDED, Phase.FAILED}, clock)
    assert (job.phase, job.exit_code) == (Phase.SUCCEEDED, 0)
    assert "bg " in log_of(job)
    assert in_namespace(namespace_of(job)) == []  # nothing held its GPU once it had ended


@needs_bwrap
@pytest.mark.slow
def test_cancel_leaves_no_setsid_escapee_nor_a_child_trapping_sigterm(submit, clock, act, world, settings):
    settings.JOBSITE_TERMINATION_GRACE_SECONDS = 1
    job = submit("bob", command=(
        "readlink /proc/self/ns/pid > ns; "
        "setsid bash -c 'trap \"\" TERM; touch setsid.up; exec sleep 1000' & "
        "bash -c 'trap \"\" TERM; touch trap.up; while :; do sleep 0.2; done' & "
        "trap '' TERM; sleep 1000"))
    wait_for(job, {Phase.RUNNING}, clock)
    ns = namespace_of(job)
    waiting.wait_for(lambda: (work_dir(job) / "setsid.up").exists() and (work_dir(job) / "trap.up").exists(),
                     message="setsid.up and trap.up")
    act(services.job_cancel, job=job, by=world.users["bob"])
    wait_for(job, {Phase.CANCELLED}, clock, timeout=60)
    assert in_namespace(ns) == []


@needs_bwrap
@pytest.mark.slow
def test_the_sandbox_dies_with_its_supervisor(submit, clock):
    job = submit("bob", command="readlink /proc/self/ns/pid > ns; setsid sleep 1000 & exec sleep 1000")
    wait_for(job, {Phase.RUNNING}, clock)
    ns = namespace_of(job)
    runner = int((get_backend().root / "state" / f"job-{job.pk}" / "attempt-1" / "replica-0" / "runner.pid")
                 .read_text().split()[0])
    os.kill(runner, signal.SIGKILL)
    waiting.wait_for(lambda: in_namespace(ns) == [], message="no process left in the sandbox's namespace")
    assert get_backend().observe(job_id=job.pk, attempt_number=1, replicas=1)[0].present is False


@needs_bwrap
@pytest.mark.slow
def test_sandboxed_processes_are_the_replicas_own(submit, clock):
    """Found by the backend (marker and supervisor), whatever user they run as."""
    job = submit("bob", command="readlink /proc/self/ns/pid > ns; exec sleep 1000")
    wait_for(job, {Phase.RUNNING}, clock)
    backend = get_backend()
    inside = set(in_namespace(namespace_of(job)))
    found = {p.pid for p in replica_processes(backend.marker(job.pk, 1, 0), table=processes(backend.uids))}
    assert inside <= found


# --- unsandboxed ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_off_runs_unsandboxed(submit, clock, settings):
    settings.JOBSITE_LOCAL_SANDBOX = "off"
    get_backend.cache_clear()
    job = submit("bob", command="readlink /proc/self/ns/pid; id -u")
    wait_for(job, {Phase.SUCCEEDED, Phase.FAILED}, clock)
    assert log_of(job) == f"{os.readlink('/proc/self/ns/pid')}\n{os.getuid()}\n"  # the server's, no warning


@pytest.mark.slow
def test_auto_without_bwrap_runs_unsandboxed_and_says_so(submit, clock, settings, monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
    settings.JOBSITE_LOCAL_SANDBOX = "auto"
    get_backend.cache_clear()
    with caplog.at_level(logging.WARNING, logger="scheduler.backends.sandbox"):
        get_backend()
    assert "bubblewrap (bwrap) was not found: job processes run unsandboxed" in caplog.text
    job = submit("bob", command="readlink /proc/self/ns/pid")
    wait_for(job, {Phase.SUCCEEDED, Phase.FAILED}, clock)
    warning, ns = log_of(job).splitlines()
    assert warning.startswith("jobsite: WARNING: bubblewrap (bwrap) was not found") and "JOBSITE_LOCAL_SANDBOX=off" \
        in warning
    assert ns == os.readlink("/proc/self/ns/pid")


@needs_bwrap
@pytest.mark.slow
def test_a_stop_while_the_sandbox_starts_reaches_the_command(settings):
    """A stop spares the sandbox's own processes, so it must still reach the command however it interleaves with
    the sandbox's start: right after the launch, once the supervisor runs, once it has recorded its child. Only
    the SIGTERM can end these in time (the grace before a SIGKILL is long)."""
    settings.JOBSITE_TERMINATION_GRACE_SECONDS = 600
    backend = get_backend("local")
    assert backend.bwrap
    waits = {1: None, 2: "runner.pid", 3: "child.pid", 4: None, 5: "runner.pid", 6: "child.pid"}
    try:
        for attempt, written in waits.items():
            backend.launch(LaunchSpec(job_id=7, attempt_id=attempt, attempt_number=attempt, command="sleep 1000",
                                      image="", replicas=[LaunchReplica(rank=0, node="", gpu_ids=(), env={})]))
            state = backend.root / "state" / "job-7" / f"attempt-{attempt}" / "replica-0"
            deadline = time.monotonic() + 60
            while written and not (state / written).exists():  # looked at closely: the window is milliseconds
                assert time.monotonic() < deadline, f"no {written} 60 s after the launch"
                time.sleep(0.001)
            backend.stop(job_id=7, attempt_number=attempt, replicas=1)
        for attempt in waits:
            def ended():
                seen = backend.observe(job_id=7, attempt_number=attempt, replicas=1)[0]  # noqa: B023
                return seen.state in (ReplicaState.EXITED, ReplicaState.LOST) and not seen.present
            waiting.wait_for(ended, timeout=60, message=f"attempt {attempt} to end")
            seen = backend.observe(job_id=7, attempt_number=attempt, replicas=1)[0]
            # Ended by the SIGTERM, or never started (the stop came first and the supervisor saw it, or the stop's
            # signal ended the launcher before it forked the supervisor).
            assert seen.exit_code == 128 + signal.SIGTERM or "stopped before it started" in seen.message, seen
    finally:
        for attempt in waits:
            backend.stop(job_id=7, attempt_number=attempt, replicas=1, force=True)
