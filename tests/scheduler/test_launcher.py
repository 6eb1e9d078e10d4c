"""The local backend's launcher (launcher.py): one long-lived process per installation forks each replica's
supervisor; without it (gone, failing) a supervisor starts as an interpreter of its own, as before."""

import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import threading

import pytest

from scheduler.backend_factory import local_backend
from scheduler.backends import launcher
from scheduler.values import LaunchReplica, LaunchSpec, ReplicaState
from tests import waiting

pytestmark = pytest.mark.slow

GIB = 1 << 30


def spec(job_id: int, command: str = "echo hello from $RANK", replicas: int = 1) -> LaunchSpec:
    return LaunchSpec(job_id=job_id, attempt_id=job_id, attempt_number=1, command=command, image="",
                      replicas=[LaunchReplica(rank=r, node="local", gpu_ids=(), env={}) for r in range(replicas)],
                      request={"gpu": 0, "cpu": 500, "memory": GIB})


def state(backend, job_id: int, rank: int = 0):
    return backend.root / "state" / f"job-{job_id}" / "attempt-1" / f"replica-{rank}"


def exit_code(backend, job_id: int, rank: int = 0) -> int:
    path = state(backend, job_id, rank) / "exit_code"
    waiting.wait_for(path.exists, timeout=60, message=f"replica {rank} of job {job_id} to end")
    return int(path.read_text())


def supervisor_pid(backend, job_id: int, rank: int = 0) -> int:
    path = state(backend, job_id, rank) / "runner.pid"
    waiting.wait_for(path.exists, timeout=60, message=f"the supervisor of job {job_id} to start")
    return int(path.read_text().split()[0])


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def launcher_pid(backend) -> int:
    return backend.launcher.request({"op": "ping"})["pid"]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def bare_backend(tmp_path):
    """A backend whose launcher has not been started yet."""
    made = local_backend(root=tmp_path / "local", gpus=8)
    yield made
    launcher.shutdown_all(made.root / "state")


@pytest.fixture
def backend(bare_backend):
    """A backend whose launcher listens."""
    bare_backend.launcher.start()
    return bare_backend


def messages(caplog, level=logging.INFO):
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


def test_a_replica_is_forked_by_the_launcher_and_runs_as_before(backend, caplog):
    with caplog.at_level(logging.INFO, logger="scheduler.backends.local"):
        backend.launch(spec(1, command="echo hello from $RANK; sleep 30", replicas=2))
    pids = [supervisor_pid(backend, 1, rank) for rank in (0, 1)]
    for pid in pids:  # forked from the launcher's interpreter (its child): its command line, not local_runner.py's
        assert any(a.endswith("launcher.py") for a in cmdline(pid)) and parent(pid) == launcher_pid(backend)
    waiting.wait_for(lambda: all(o.state == ReplicaState.RUNNING
                                 for o in backend.observe(job_id=1, attempt_number=1, replicas=2)), timeout=60)
    backend.stop(job_id=1, attempt_number=1, replicas=2)
    assert [exit_code(backend, 1, rank) for rank in (0, 1)] == [143, 143]  # SIGTERM, as any replica's
    for rank in (0, 1):
        log = backend.log_path(job_id=1, attempt_number=1, rank=rank).read_text()
        assert f"hello from {rank}" in log
    assert not caplog.records  # no fallback was needed
    waiting.wait_for(lambda: not any(alive(pid) for pid in pids), timeout=60, message="the supervisors to end")
    launcher_pid(backend)  # a request: the launcher collects its children that have ended first
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]  # no zombie left


def test_the_launcher_socket_is_private_and_survives_a_new_backend(backend, tmp_path):
    backend.launch(spec(1, command="true"))
    assert exit_code(backend, 1) == 0
    path = backend.launcher.path
    assert path.parent == backend.root / "state"  # a directory no sandbox mounts
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    first = launcher_pid(backend)
    again = local_backend(root=backend.root, gpus=8)  # the scheduler restarted: it finds the same launcher
    again.launch(spec(2, command="true"))
    assert exit_code(again, 2) == 0
    assert launcher_pid(again) == first


def test_another_user_cannot_use_the_launcher(backend):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    backend.launch(spec(1, command="true"))
    assert exit_code(backend, 1) == 0
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # as nobody: the socket's mode keeps it out
        try:
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(backend.launcher.path))
            os.write(write, b"connected")
        except PermissionError:
            os.write(write, b"refused")
        except BaseException as exc:  # noqa: BLE001
            os.write(write, repr(exc).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 200) == b"refused"
    os.close(read)


def test_the_first_launch_starts_the_launcher_without_waiting_for_it(bare_backend, caplog):
    """Its supervisor starts as an interpreter (an info line says so); the launches after are forked."""
    with caplog.at_level(logging.INFO, logger="scheduler.backends.local"):
        bare_backend.launch(spec(1, command="sleep 30"))
    assert any(a.endswith("local_runner.py") for a in cmdline(supervisor_pid(bare_backend, 1)))
    assert [m for m in messages(caplog) if "starting one" in m and "interpreter of its own" in m]
    assert not messages(caplog, logging.WARNING)
    waiting.wait_for(lambda: not bare_backend.launcher._starting, timeout=60, message="the launcher to start")
    bare_backend.launch(spec(2, command="sleep 30"))
    assert any(a.endswith("launcher.py") for a in cmdline(supervisor_pid(bare_backend, 2)))
    for job_id in (1, 2):
        bare_backend.stop(job_id=job_id, attempt_number=1, replicas=1)
        assert exit_code(bare_backend, job_id) == 143


def test_a_replica_outlives_its_launcher_and_a_killed_launcher_is_replaced(backend, caplog):
    backend.launch(spec(1, command="sleep 30"))
    supervisor = supervisor_pid(backend, 1)
    old = launcher_pid(backend)
    os.kill(old, signal.SIGKILL)  # its socket file stays behind: nobody listens on it
    waiting.wait_for(lambda: not alive(old), timeout=30)
    assert alive(supervisor)
    with caplog.at_level(logging.WARNING, logger="scheduler.backends.local"):
        backend.launch(spec(2, command="true"))  # an interpreter, and a new launcher started meanwhile
    assert [m for m in messages(caplog, logging.WARNING) if "unavailable" in m and "starting one" in m]
    assert exit_code(backend, 2) == 0
    waiting.wait_for(lambda: not backend.launcher._starting, timeout=60, message="the new launcher to start")
    backend.launch(spec(3, command="sleep 30"))  # alive while its command line is read
    assert any(a.endswith("launcher.py") for a in cmdline(supervisor_pid(backend, 3)))
    assert launcher_pid(backend) != old
    assert [o.state for o in backend.observe(job_id=1, attempt_number=1, replicas=1)] == [ReplicaState.RUNNING]
    for job_id in (1, 3):
        backend.stop(job_id=job_id, attempt_number=1, replicas=1)
        assert exit_code(backend, job_id) == 143


def test_without_a_launcher_the_supervisor_starts_as_an_interpreter_and_says_so(bare_backend, caplog):
    backend = bare_backend
    backend.launcher.python = "/nonexistent/python"  # no launcher can start
    backend.launch(spec(1, command="echo fell back; sleep 30"))
    pid = supervisor_pid(backend, 1)
    assert any(a.endswith("local_runner.py") for a in cmdline(pid))
    waiting.wait_for(lambda: backend.launcher.failure, timeout=60, message="the launcher's start to fail")
    with caplog.at_level(logging.WARNING, logger="scheduler.backends.local"):
        backend.launch(spec(2, command="true"))  # not tried again at once: straight to an interpreter
    assert exit_code(backend, 2) == 0
    assert [m for m in messages(caplog, logging.WARNING)
            if "unavailable" in m and "the last start failed" in m and "interpreter of its own" in m]
    backend.stop(job_id=1, attempt_number=1, replicas=1)
    assert exit_code(backend, 1) == 143
    assert "fell back" in backend.log_path(job_id=1, attempt_number=1, rank=0).read_text()


def test_a_launcher_that_takes_the_request_but_never_answers_is_not_bypassed(bare_backend, caplog):
    """It may have started the supervisor: a second one would run the replica twice. The start timeout decides."""
    backend = bare_backend
    path = backend.launcher.path
    path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(str(path))
        mute.listen(1)

        def swallow():
            conn, _ = mute.accept()
            launcher.recv_message(conn)
            conn.close()  # no answer

        reader = threading.Thread(target=swallow)
        reader.start()
        with caplog.at_level(logging.WARNING, logger="scheduler.backends.local"):
            backend.launch(spec(1, command="true"))
        reader.join(30)
    assert any("gave no answer" in r.getMessage() for r in caplog.records)
    assert not [p for p in backend._launchers if str(launcher.RUNNER) in p.args]  # no interpreter started
    assert (state(backend, 1) / "launched").exists()  # observe loses it after the start timeout


def test_a_launcher_refuses_another_supervisor_than_its_own(backend):
    backend.launch(spec(1, command="true"))
    assert exit_code(backend, 1) == 0
    answer = backend.launcher.request({"op": "launch", "argv": ["python", "/tmp/other.py", "--", "true"],
                                       "env": {}})
    assert "not /tmp/other.py" in answer["error"]


def test_an_idle_launcher_exits(tmp_path):
    client = launcher.Launcher(tmp_path, idle=0.0)
    client.start()
    pid = client.request({"op": "ping"})["pid"]
    waiting.wait_for(lambda: not alive(pid), timeout=60, message="the idle launcher to exit")
    assert not client.path.exists()


SCHEDULER = """
import sys
import django
django.setup()
from scheduler.values import LaunchReplica, LaunchSpec
from scheduler.backend_factory import local_backend
backend = local_backend(root=sys.argv[1], gpus=1)
backend.launcher.start()
backend.launch(LaunchSpec(job_id=1, attempt_id=1, attempt_number=1, image="", command=sys.argv[2],
                          replicas=[LaunchReplica(rank=0, node="local", gpu_ids=(0,), env={})]))
print("launched", flush=True)
sys.stdin.read()  # until killed
"""


def test_a_scheduler_killed_with_its_process_group_after_a_launch_kills_neither_replica_nor_launcher(tmp_path):
    """The launcher and each supervisor it forks are sessions of their own: killing the scheduler's process group
    the moment its launch returns leaves the replica running to its end, and the launcher serving the next one."""
    from django.conf import settings as django_settings

    root = tmp_path / "root"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "jobsite.settings", "JOBSITE_LOCAL_SANDBOX": "off",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'unused.sqlite3'}", "LOG_LEVEL": "WARNING"}
    env.pop("REDIS_URL", None)
    scheduler = subprocess.Popen([sys.executable, "-c", SCHEDULER, str(root), "sleep 1; echo ran to the end"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True,
                                 cwd=str(django_settings.BASE_DIR))
    try:
        assert scheduler.stdout.readline() == b"launched\n"
        os.killpg(scheduler.pid, signal.SIGKILL)
    finally:
        scheduler.kill()
        scheduler.wait()
    restarted = local_backend(root=root, gpus=1)
    assert exit_code(restarted, 1) == 0
    assert (root / "logs" / "job-1" / "attempt-1" / "replica-0.log").read_text() == "ran to the end\n"
    assert restarted.launcher.request({"op": "ping"})["ok"]  # the same launcher, still serving
