"""`make prod`: PostgreSQL, Redis, the web server, the scheduler process and a Celery worker with beat."""

import os
import subprocess
import time
import urllib.error

import pytest

from .api import call, machine_address, probes
from .servers import make_server

pytestmark = pytest.mark.e2e


@pytest.fixture
def prod_server(tmp_path):
    db = f"jobsite_prodtest_{os.getpid()}"
    psql = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c"]
    subprocess.run([*psql, f'DROP DATABASE IF EXISTS "{db}"'], check=True)
    try:
        with make_server("prod", tmp_path / "var", DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{db}",
                         REDIS_URL="redis://127.0.0.1:6379/14") as base:
            yield base
    finally:
        subprocess.run([*psql, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'], check=False)


def test_make_prod_runs_a_job_through_celery_and_the_scheduler_process(prod_server):
    base = prod_server
    token = call(base, "POST", "/api/v1/auth/token/", {"username": "bob", "password": "smoke-pass"})["token"]
    port = int(base.rsplit(":", 1)[1])
    # The job tries every server of the topology, on loopback and the machine's address (issue 20): none answers.
    targets = {f"{name} on {host}": (host, p) for name, p in (
        ("web", port), ("PostgreSQL", 5432), ("Redis", 6379), ("the scheduler's HTTP port", port + 100))
        for host in ("127.0.0.1", machine_address())}
    job = call(base, "POST", "/api/v1/jobs/", {"group": "phusers", "image": "base-notebook",
                                               "instance_type": "gpu-1",
                                               "command": probes(targets) + "echo hello from prod"},
               token=token)
    # Generous and tolerant: on a busy 2-core machine the scheduler process and the worker may take a while, and
    # one slow read (a TimeoutError) is a reason to ask again, not a failure.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job["phase"] not in ("SUCCEEDED", "FAILED"):
        time.sleep(0.3)
        try:
            job = call(base, "GET", f"/api/v1/jobs/{job['id']}/", token=token)
        except (urllib.error.URLError, OSError):
            continue
    assert job["phase"] == "SUCCEEDED", job
    assert call(base, "GET", f"/api/v1/jobs/{job['id']}/logs/", token=token).splitlines() == [
        f"refused {name}" for name in targets] + ["hello from prod"]
