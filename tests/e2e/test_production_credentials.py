"""`make prod` with this machine's PostgreSQL and Redis and no URLs given: every process runs on the installation's
own credentials (jobsite/provision.py), a PostgreSQL role that owns only its database and a Redis ACL user limited
to the installation's keys and channels, and /metrics (web and scheduler) needs the installation's token."""

import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import redis

from .api import call
from .servers import make_server

pytestmark = pytest.mark.e2e

PSQL = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-X", "-q", "-t", "-A", "-d", "postgres", "-c"]


@pytest.fixture
def provisioned(tmp_path):
    db, var = f"jobsite_provtest_{os.getpid()}", tmp_path / "var"
    subprocess.run([*PSQL, f'DROP DATABASE IF EXISTS "{db}"'], check=True)
    try:
        with make_server("prod", var, JOBSITE_PROD_DATABASE=db, JOBSITE_PROD_REDIS_DB="14") as base:
            yield base, var, db
    finally:
        subprocess.run([*PSQL, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'], check=False)
        installation = (var / "installation-id").read_text().strip()
        subprocess.run([*PSQL, f'DROP ROLE IF EXISTS "jobsite_{installation}"'], check=False)
        client = redis.Redis.from_url("redis://127.0.0.1:6379/14")
        client.execute_command("ACL", "DELUSER", f"jobsite-{installation}")
        for key in client.scan_iter(f"jobsite:{installation}:*"):
            client.delete(key)
        client.close()


def status_of(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_make_prod_runs_on_the_installations_own_credentials(provisioned):
    base, var, db = provisioned
    installation = (var / "installation-id").read_text().strip()
    for name in ("secret-key", "installation-id", "db-password", "redis-password", "metrics-token"):
        assert (var / name).stat().st_mode & 0o077 == 0, name  # kept beside secret-key, for its owner only

    token = call(base, "POST", "/api/v1/auth/token/", {"username": "bob", "password": "smoke-pass"})["token"]
    job = call(base, "POST", "/api/v1/jobs/", {"group": "phusers", "image": "base-notebook",
                                               "instance_type": "cpu-tiny", "command": "echo provisioned"},
               token=token)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job["phase"] not in ("SUCCEEDED", "FAILED"):
        time.sleep(0.3)
        try:
            job = call(base, "GET", f"/api/v1/jobs/{job['id']}/", token=token)
        except (urllib.error.URLError, OSError):
            continue
    assert job["phase"] == "SUCCEEDED", job

    # Every connection to the installation's database is its own role's, never postgres.
    users = subprocess.run([*PSQL, f"SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = '{db}'"],
                           check=True, capture_output=True, text=True).stdout.split()
    assert users == [f"jobsite_{installation}"]
    # Web, scheduler and worker talk to Redis as the installation's ACL user, under its prefix (Celery's keys too).
    client = redis.Redis.from_url("redis://127.0.0.1:6379/14")
    names = {c.get("user") for c in client.client_list() if c.get("db") == "14"}
    assert f"jobsite-{installation}" in names
    assert any(client.scan_iter(f"jobsite:{installation}:celery:*"))
    client.close()
    log = (var.parent / "prod.log").read_text()
    assert "Traceback" not in log and "NoPermission" not in log and "WRONGPASS" not in log, log[-3000:]

    # /metrics of the web and of the scheduler: the installation's token, nothing else.
    metrics_token = (var / "metrics-token").read_text().strip()
    scheduler = base.rsplit(":", 1)[0] + f":{int(base.rsplit(':', 1)[1]) + 100}"
    for url in (base + "/metrics", scheduler + "/metrics"):
        assert status_of(url) == 401, url
        assert status_of(url, "wrong-token") == 401, url
        assert status_of(url, metrics_token) == 200, url
