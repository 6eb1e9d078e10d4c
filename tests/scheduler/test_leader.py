"""Leader election by a PostgreSQL advisory lock (the Lease is tested in tests/k8s/test_leader.py)."""

from __future__ import annotations

import time

import pytest
from django.db import connection

from scheduler.leader import AdvisoryLockElector

pytestmark = pytest.mark.fast


@pytest.mark.django_db(transaction=True)
def test_advisory_lock_one_holder_until_its_connection_goes():
    if connection.vendor != "postgresql":
        pytest.skip("advisory locks are PostgreSQL's")
    a, b = AdvisoryLockElector(key=4242), AdvisoryLockElector(key=4242)
    try:
        assert a.acquire_or_renew() is True
        assert b.acquire_or_renew() is False
        assert a.acquire_or_renew() is True  # renewing keeps it
        a._conn.close()  # the leader's process dies: PostgreSQL drops its session lock with the connection
        # ... once its server process has ended the session, which it does a moment after the client went.
        deadline = time.monotonic() + 30
        while not b.acquire_or_renew() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.acquire_or_renew() is True
        assert a.acquire_or_renew() is False  # back, it finds the lock taken
    finally:
        a.release()
        b.release()
