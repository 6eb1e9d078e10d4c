"""The web process under ASGI holds at most JOBSITE_DB_POOL_MAX PostgreSQL connections, whatever the load."""

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from .api import call, free_port
from .servers import ROOT, START_TIMEOUT, serving

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PG = "postgres://postgres@127.0.0.1:5432"
POOL_MAX = 3


def _connections(admin: psycopg.Connection, db: str) -> int:
    return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [db]).fetchone()[0]


def _request(base: str, token: str, *, submit: bool) -> int:
    """A submit or a page of the list; the HTTP status."""
    headers = {"Authorization": f"Token {token}"}
    if submit:
        body = json.dumps({"group": "phusers", "image": "base-notebook", "instance_type": "cpu-tiny",
                           "command": "true"}).encode()
        req = urllib.request.Request(base + "/api/v1/jobs/", data=body, method="POST",
                                     headers={**headers, "Content-Type": "application/json"})
    else:
        req = urllib.request.Request(base + "/api/v1/jobs/?page_size=5", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def pooled_web(tmp_path):
    """uvicorn alone (the scheduler and worker are other processes) on its own database: every connection to
    that database is the web's."""
    db = f"jobsite_pooltest_{os.getpid()}"
    admin = psycopg.connect(f"{PG}/postgres", autocommit=True)
    admin.execute(f'DROP DATABASE IF EXISTS "{db}"')
    admin.execute(f'CREATE DATABASE "{db}"')
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(DATABASE_URL=f"{PG}/{db}", REDIS_URL=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/14"),
               JOBSITE_SCHEDULER_MODE="process", JOBSITE_VAR_DIR=str(tmp_path / "var"), DEMO_PASSWORD="pool-pass",
               JOBSITE_DB_POOL_MAX=str(POOL_MAX), JOBSITE_LOCAL_USE_NVIDIA_SMI="false",
               SECRET_KEY="pool-test-" + "k" * 40)
    for command in (["migrate", "--noinput"], ["seed_demo"]):
        subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, check=True, capture_output=True,
                       timeout=START_TIMEOUT)
    port = free_port()
    argv = [str(ROOT / ".venv/bin/uvicorn"), "jobsite.asgi:application", "--host", "127.0.0.1", "--port", str(port),
            "--no-access-log"]
    try:
        with serving(argv, env, tmp_path / "uvicorn.log", port, "uvicorn") as base:
            yield base, db, admin
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.close()


def test_many_concurrent_requests_use_at_most_the_pool_of_connections(pooled_web):
    base, db, admin = pooled_web
    token = call(base, "POST", "/api/v1/auth/token/", {"username": "bob", "password": "pool-pass"})["token"]
    peak = 0
    stop = threading.Event()

    def sample():
        nonlocal peak
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            while not stop.is_set():
                peak = max(peak, _connections(conn, db))
                stop.wait(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(max_workers=40) as pool:
            statuses = list(pool.map(lambda i: _request(base, token, submit=i % 4 == 0), range(160)))
    finally:
        stop.set()
        sampler.join(timeout=60)

    assert sorted(set(statuses)) == [200, 201], statuses
    assert 1 <= peak <= POOL_MAX, peak
    assert _connections(admin, db) <= POOL_MAX  # and no more stay open afterwards


def test_requests_after_the_database_ended_every_connection_succeed(pooled_web):
    """Four times, PostgreSQL ends every connection of the web's pool (as on a restart or failover) between
    requests: the pool checks each connection before handing it out, and no request fails."""
    base, db, admin = pooled_web
    token = call(base, "POST", "/api/v1/auth/token/", {"username": "bob", "password": "pool-pass"})["token"]
    statuses: list[int] = []
    with ThreadPoolExecutor(max_workers=POOL_MAX * 2) as pool:
        for _ in range(4):
            # Several requests at once, so that the pool holds more than one connection when they end.
            statuses += pool.map(lambda i: _request(base, token, submit=i % 3 == 0), range(POOL_MAX * 4))
            ended = admin.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 30000)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()", [db]).fetchone()[0]
            assert ended >= 1  # the pool keeps at least one connection open
            statuses += [_request(base, token, submit=i % 2 == 0) for i in range(POOL_MAX + 1)]
    failed = [s for s in statuses if s not in (200, 201)]
    assert not failed, f"{len(failed)} of {len(statuses)} requests failed: {statuses}"
    assert statuses.count(201) >= 4 * 2
