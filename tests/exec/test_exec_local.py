"""Exec into a running job on the local backend, end to end: a real sandboxed replica, its supervisor's exec socket,
the WebSocket ``/ws/jobs/<id>/exec/`` as jobctl speaks it (an API token) and as the browser does (the session)."""

from __future__ import annotations

import json
import shutil

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from prometheus_client import REGISTRY

from jobs.models import JobEvent
from scheduler.backend_factory import get_backend

from .conftest import cookie_headers, token_headers

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("sandboxed"),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")]

STDIN, STDOUT, STDERR, STATUS, RESIZE = 0, 1, 2, 3, 4


def session(path: str, headers, frames: list[bytes] = (), until: bytes = b"", on_until=None):
    """Open the exec socket, send ``frames`` (each a channel byte and data; ``until``: only once stdout holds it),
    read to the end: (stdout, stderr, status, close code)."""
    from jobsite.asgi import application

    async def run():
        nonlocal on_until
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect(timeout=30)
        assert connected
        out, err, status, code = b"", b"", None, None
        pending = list(frames)
        if not until:
            for frame in pending:
                await communicator.send_to(bytes_data=frame)
            pending = []
        while True:
            message = await communicator.receive_output(timeout=60)
            if message["type"] == "websocket.close":
                code = message.get("code")
                break
            data = message.get("bytes") or b""
            channel, body = data[0], data[1:]
            if channel == STDOUT:
                out += body
            elif channel == STDERR:
                err += body
            elif channel == STATUS:
                status = json.loads(body)
            if until and until in out and (pending or on_until):
                if on_until:
                    await sync_to_async(on_until)()
                    on_until = None
                for frame in pending:
                    await communicator.send_to(bytes_data=frame)
                pending = []
        await communicator.wait()
        return out, err, status, code

    return async_to_sync(run)()


def exec_path(job, *command: str, **query) -> str:
    from urllib.parse import urlencode

    return f"/ws/jobs/{job.pk}/exec/?" + urlencode([*(("command", c) for c in command), *query.items()])


def sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_exec_returns_the_output_and_exit_code_and_leaves_an_event(running, world):
    job = running()
    opened = sample("jobsite_job_sessions_total", kind="exec")
    out, err, status, code = session(exec_path(job, "sh", "-c", "echo hello; echo oops >&2; exit 7"),
                                     token_headers(world.users["bob"]))
    assert (out, err) == (b"hello\n", b"oops\n")
    assert status["status"] == "Failure" and status["exit_code"] == 7
    assert code == 1000
    event = JobEvent.objects.filter(job=job, reason="Exec").get()
    assert "bob ran a command in replica 0: sh -c 'echo hello; echo oops >&2; exit 7'" in event.message
    assert "exit code 7" in event.message
    assert sample("jobsite_job_sessions_total", kind="exec") == opened + 1  # in /metrics (the default registry)


def test_exec_runs_inside_the_sandbox(running, world, settings):
    job = running()
    script = ("id -u; echo $JOB_ID; ls /proc | grep -c '^[0-9]'; "
              f"test -e {settings.BASE_DIR}/manage.py && echo SEES-CODE; test -e {settings.VAR_DIR} && echo SEES-VAR; "
              "cat /proc/self/cgroup | head -1 >&2")
    out, err, status, _ = session(exec_path(job, "sh", "-c", script), token_headers(world.users["bob"]))
    uid, job_id, count, *rest = out.decode().split()
    assert status == {"status": "Success"}
    assert int(uid) == settings.JOBSITE_LOCAL_SANDBOX_UID
    assert job_id == str(job.pk)
    assert int(count) < 10  # its own PID namespace: the replica's few processes, not the machine's
    assert rest == []  # neither the code tree nor var/ (the database, the supervisors' sockets) is there


def test_stdin_reaches_the_command(running, world):
    job = running()
    out, _, status, _ = session(exec_path(job, "cat"), token_headers(world.users["bob"]),
                                frames=[bytes([STDIN]) + b"through stdin\n", bytes([STDIN])])
    assert out == b"through stdin\n" and status == {"status": "Success"}


def test_a_terminal_has_a_pty_resizes_and_ctrl_c_interrupts(running, world):
    job = running()
    script = "stty size; echo READY; trap 'stty size; echo INTERRUPTED; exit 3' INT; while :; do sleep 1; done"
    out, _, status, _ = session(exec_path(job, "sh", "-c", f"sleep 0.5; {script}", tty="1", rows="30", cols="100"),
                                cookie_headers(world.users["bob"]), until=b"READY",
                                frames=[bytes([RESIZE]) + b'{"Width": 120, "Height": 40}', bytes([STDIN]) + b"\x03"])
    text = out.decode()
    assert "30 100" in text and "40 120" in text and "INTERRUPTED" in text
    assert status["exit_code"] == 3


def test_outsiders_get_404_and_a_job_not_running_409(running, world, submit):
    job = running()
    for user in (world.users["eve"],):
        _, _, status, code = session(exec_path(job, "id"), token_headers(user))
        assert (status["code"], code) == (404, 4404)
    _, _, status, code = session(exec_path(job, "id"), [(b"host", b"testserver"), (b"origin", b"http://testserver")])
    assert code == 4404
    queued = submit("bob", command="true", instance_type="gpu-4", group="phusers")
    queued.refresh_from_db()
    _, _, status, code = session(exec_path(queued, "id"), token_headers(world.users["bob"]))
    assert code == 4409 and queued.get_phase_display() in status["message"]
    assert not JobEvent.objects.filter(reason="Exec").exists()


def test_the_session_ends_when_the_job_stops(running, world):
    job = running()
    stop = lambda: get_backend().stop(job_id=job.pk, attempt_number=1, replicas=1, force=True)  # noqa: E731
    out, _, status, code = session(exec_path(job, "sh", "-c", "echo STARTED; sleep 600"),
                                   token_headers(world.users["bob"]), until=b"STARTED", on_until=stop)
    assert out == b"STARTED\n" and code == 1000
    # The stop kills the replica's processes together: the supervisor either reports the command killed first (a
    # non-zero exit code) or dies with it, and the session ends without one. Either way it fails, and is recorded.
    assert status["status"] == "Failure"
    assert status.get("exit_code", 0) != 0 or (status["reason"], status["message"]) == ("ended", "session ended")
    assert JobEvent.objects.filter(job=job, reason="Exec").count() == 1


def test_an_idle_session_is_closed(running, world, settings):
    settings.JOBSITE_EXEC_IDLE_SECONDS = 1.0
    settings.JOBSITE_EXEC_CHECK_SECONDS = 0.2
    job = running()
    opened = sample("jobsite_job_sessions_open", kind="exec")
    _, _, status, code = session(exec_path(job, "sleep", "600"), token_headers(world.users["bob"]))
    assert status["reason"] == "idle" and "without input or output" in status["message"]
    assert sample("jobsite_job_sessions_open", kind="exec") == opened
    assert "idle" in JobEvent.objects.get(job=job, reason="Exec").message
