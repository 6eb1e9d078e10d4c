"""Smoke test of the embedded default: `make run` on a fresh SQLite file, then the API from outside."""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, body=None, token=None):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read().decode()
        return json.loads(raw) if resp.headers.get_content_type() == "application/json" else raw


@pytest.fixture
def embedded_server(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(PORT=str(port), JOBSITE_VAR_DIR=str(tmp_path / "var"), DEMO_PASSWORD="smoke-pass",
               JOBSITE_LOCAL_USE_NVIDIA_SMI="false")
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(["make", "--no-print-directory", "run"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            urllib.request.urlopen(base + "/login/", timeout=2)
            break
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.3)
    if proc.poll() is not None:
        pytest.fail("make run exited:\n" + (tmp_path / "server.log").read_text())
    yield base
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()
    assert (tmp_path / "var" / "jobsite.sqlite3").exists()  # SQLite, no other service


def test_make_run_serves_and_runs_echo_hello(embedded_server):
    base = embedded_server
    token = call(base, "POST", "/api/v1/auth/token/", {"username": "bob", "password": "smoke-pass"})["token"]
    job = call(base, "POST", "/api/v1/jobs/", {
        "name": "smoke", "group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny",
        "command": "echo hello",
    }, token=token)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = call(base, "GET", f"/api/v1/jobs/{job['id']}/", token=token)
        if job["phase"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(0.3)
    assert job["phase"] == "SUCCEEDED", job
    assert job["color"] == "#0000ff"
    assert call(base, "GET", f"/api/v1/jobs/{job['id']}/logs/", token=token).strip() == "hello"
    # The dashboard itself answers: the login page, and the job list once logged in is behind auth.
    page = urllib.request.urlopen(base + "/login/", timeout=10).read().decode()
    assert "<form" in page
