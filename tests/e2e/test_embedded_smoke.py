"""Smoke test of the embedded default: `make run` on a fresh SQLite file, then the API from outside."""

import time
import urllib.request

import pytest

from .api import call, machine_address, probes

pytestmark = pytest.mark.e2e


def test_make_run_serves_and_runs_echo_hello(embedded_server):
    base = embedded_server
    token = call(base, "POST", "/api/v1/auth/token/", {"username": "bob", "password": "smoke-pass"})["token"]
    port = int(base.rsplit(":", 1)[1])
    # The job tries the server it runs under, on every address of the machine (issue 20): nothing answers.
    targets = {"web on loopback": ("127.0.0.1", port), "web on the machine's address": (machine_address(), port)}
    job = call(base, "POST", "/api/v1/jobs/", {
        "name": "smoke", "group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny",
        "command": probes(targets) + "echo hello",
    }, token=token)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = call(base, "GET", f"/api/v1/jobs/{job['id']}/", token=token)
        if job["phase"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(0.3)
    assert job["phase"] == "SUCCEEDED", job
    assert job["color"] == "#0000ff"
    assert call(base, "GET", f"/api/v1/jobs/{job['id']}/logs/", token=token).splitlines() == [
        f"refused {name}" for name in targets] + ["hello"]
    # The dashboard itself answers: the login page, and the job list once logged in is behind auth.
    page = urllib.request.urlopen(base + "/login/", timeout=10).read().decode()
    assert "<form" in page
