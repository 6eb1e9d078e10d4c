"""The production web server (``python -m jobsite.serve_web``) with several processes behind one port: each takes
the port's connections through its gated loop (``jobsite.accept_gate``) and every request is answered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.api import free_port
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]


def answered(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status
    except OSError:
        return None


@pytest.fixture
def served(tmp_path):
    port, log = free_port(), tmp_path / "web.log"
    env = {**os.environ, "JOBSITE_WEB_WORKERS": "2", "JOBSITE_WEB_THREADS": "2",
           "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"), "DJANGO_SETTINGS_MODULE": "jobsite.settings"}
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "jobsite.serve_web", "--host", "127.0.0.1", "--port",
                                    str(port)], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: answered(base + "/login/") == 200 or process.poll() is not None, timeout=180,
                 message="the web server to answer")
        assert process.poll() is None, log.read_text()[-3000:]
        yield base, log
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)


def test_several_processes_behind_one_port_take_connections_through_their_gate_and_answer_all(served):
    base, log = served
    with ThreadPoolExecutor(max_workers=16) as pool:  # 16 at once: more than the two processes' 2 threads each
        statuses = list(pool.map(lambda _: answered(base + "/login/"), range(64)))
    assert statuses == [200] * 64
    # Each process says so once its startup is complete: the second may finish after the first answered all 64.
    gated = "web: this process takes connections on ('127.0.0.1', "
    wait_for(lambda: log.read_text().count(gated) == 2, timeout=180, message=lambda: "both processes' gates: "
             + log.read_text()[-3000:])
    text = log.read_text()
    assert "fewer than 2 requests in hand" in text and "accepting a connection failed" not in text
