"""A real embedded server, started as `make run` starts it, on a fresh SQLite file; and a tiny API client."""

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .api import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def embedded_server(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("embedded")
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
