"""`jobctl exec` against the embedded server of `make run`: a command in a running job's sandbox, its output and
exit code; a refusal for a job that is not Running."""

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests import waiting
from tests.e2e.api import call

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def jobctl(base, tmp_path, *args, timeout=120):
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "JOBSITE_URL": base}
    return subprocess.run([sys.executable, "-m", "jobctl.main", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def shell(base, tmp_path, args, keys: bytes) -> tuple[bytes, int]:
    """jobctl on a terminal of its own (a pty): ``keys`` typed once the remote prompt shows; (what it printed,
    its exit code)."""
    import pty
    import select

    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "JOBSITE_URL": base}
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "jobctl.main", *args], cwd=ROOT, env=env, stdin=slave,
                            stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out, typed, deadline = b"", False, time.monotonic() + 120
    while time.monotonic() < deadline:
        if select.select([master], [], [], 1)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: jobctl ended
                break
            if not chunk:
                break
            out += chunk
        if not typed and b"$ " in out:
            os.write(master, keys)
            typed = True
    os.close(master)
    return out, proc.wait(timeout=60)


def wait_phase(base, token, job_id, phases, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = call(base, "GET", f"/api/v1/jobs/{job_id}/", token=token)
        if job["phase"] in phases:
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} stayed {job['phase']}")


def test_jobctl_exec_prints_the_output_and_exits_with_the_code(embedded_server, tmp_path):
    base = embedded_server
    assert jobctl(base, tmp_path, "login", "-u", "bob", "-p", "smoke-pass").returncode == 0
    token = call(base, "POST", "/api/v1/auth/token/", {"username": "bob", "password": "smoke-pass"})["token"]
    job = call(base, "POST", "/api/v1/jobs/", {"name": "exec", "group": "phusers", "image": "base-notebook",
                                               "instance_type": "cpu-tiny", "command": "sleep 600"}, token=token)
    wait_phase(base, token, job["id"], {"RUNNING"})
    try:
        done = jobctl(base, tmp_path, "exec", str(job["id"]), "--", "sh", "-c", "echo hello; exit 7")
        assert (done.stdout, done.returncode) == ("hello\n", 7), done.stderr
        done = jobctl(base, tmp_path, "exec", str(job["id"]), "--", "sh", "-c", "id -u; ls /proc | grep -c '^[0-9]'")
        uid, count = done.stdout.split()
        assert uid != str(os.getuid()) and int(count) < 10
        # -it on a terminal: a shell in the job, the keys typed reach it, its exit code is jobctl's.
        out = shell(base, tmp_path, ["exec", "-it", str(job["id"])], b"echo in-job=$JOB_ID; exit 5\r")
        assert f"in-job={job['id']}".encode() in out[0] and out[1] == 5
    finally:
        call(base, "POST", f"/api/v1/jobs/{job['id']}/cancel/", {}, token=token)
    wait_phase(base, token, job["id"], {"CANCELLED"})
    done = jobctl(base, tmp_path, "exec", str(job["id"]), "--", "true")
    assert done.returncode == 1 and "Cancelled, not Running" in done.stderr


def test_jobctl_port_forward_reaches_a_declared_port(embedded_server, tmp_path):
    base = embedded_server
    assert jobctl(base, tmp_path, "login", "-u", "bob", "-p", "smoke-pass").returncode == 0
    token = call(base, "POST", "/api/v1/auth/token/", {"username": "bob", "password": "smoke-pass"})["token"]
    command = ("mkdir -p site && echo forwarded > site/index.html && "
               "exec python3 -m http.server 8888 --bind 127.0.0.1 --directory site")
    job = call(base, "POST", "/api/v1/jobs/", {"name": "web", "group": "phusers", "image": "base-notebook",
                                               "instance_type": "cpu-tiny", "command": command,
                                               "ports": [{"name": "web", "port": 8888}]}, token=token)
    wait_phase(base, token, job["id"], {"RUNNING"})
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "JOBSITE_URL": base}
    forward = subprocess.Popen([sys.executable, "-m", "jobctl.main", "port-forward", str(job["id"]), "0:8888"],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = forward.stdout.readline()
        assert line.startswith("Forwarding from 127.0.0.1:"), (line, forward.stderr.read() if forward.poll() else "")
        local = int(line.split()[2].rsplit(":", 1)[1])
        body = []

        def answered():
            try:
                body.append(urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=30).read())
            except OSError:  # the server in the job is not listening yet
                return False
            return True

        waiting.wait_for(answered, timeout=60, message="the job's server through jobctl port-forward")
        assert body[-1] == b"forwarded\n"
    finally:
        forward.kill()
        forward.wait()
        call(base, "POST", f"/api/v1/jobs/{job['id']}/cancel/", {}, token=token)
