"""After PostgreSQL ended every connection (a restart, a failover, the chaos run's kills), the next thread that asks
the pool for a connection gets a live one at once (jobsite.dbpool), instead of trying the dead ones one by one with
psycopg_pool's growing pauses between them until its timeout fails it."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection, connections
from psycopg_pool import ConnectionPool, PoolTimeout

from jobs.models import Job
from jobsite import dbpool
from scheduler.leader import dedicated_connection

pytestmark = [pytest.mark.slow]

IDLE = 8  # dead connections waiting in the pool: 0 + 1 + 2 + 4 + 8 + 16 + 32 s of pauses to try them all


def end_backends(where: str, params: list) -> int:
    """PostgreSQL ends the matching connections; returns how many once all have gone."""
    with dedicated_connection() as admin:
        return admin.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 30000)) FROM pg_stat_activity "
            f"WHERE pid <> pg_backend_pid() AND {where}", params).fetchone()[0]


def pool_of_dead_connections(check) -> ConnectionPool:
    name = f"jobsite-pool-test-{uuid.uuid4().hex[:8]}"
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    pool = ConnectionPool(kwargs={**params, "application_name": name, "autocommit": True}, min_size=IDLE,
                          max_size=IDLE, timeout=6, check=check, open=True)
    pool.wait(60)
    assert end_backends("application_name = %s", [name]) == IDLE
    return pool


@pytest.mark.django_db
@pytest.mark.parametrize("check", [ConnectionPool.check_connection, dbpool.check_connection],
                         ids=["psycopg_pool's check", "jobsite's"])
def test_a_pool_whose_idle_connections_all_died_gives_a_live_one(check):
    pool = pool_of_dead_connections(check)
    try:
        if check is ConnectionPool.check_connection:  # the finding: the asker waits out its 6 s and fails
            with pytest.raises(PoolTimeout), pool.connection():
                pass
            return
        with pool.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert pool.get_stats()["connections_lost"] == IDLE  # all swept at the first dead one found
    finally:
        pool.close()


@pytest.mark.django_db(transaction=True)
def test_django_reads_on_after_the_database_ended_every_pooled_connection():
    """Django's own pool (settings: ENGINE jobsite.postgresql) holds IDLE connections when PostgreSQL ends them all;
    the next query succeeds (with psycopg_pool's own check it waited 30 s and failed: PoolTimeout)."""
    assert connection.pool is not None and connection.pool.max_size >= IDLE
    assert connection.settings_dict["ENGINE"] == "jobsite.postgresql"
    opened = threading.Barrier(IDLE)
    errors: list[BaseException] = []

    def hold_one() -> None:  # IDLE threads each take a connection at once, then give it back to the pool
        try:
            connections["default"].ensure_connection()
            opened.wait(60)
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=hold_one) for _ in range(IDLE)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    connection.close()
    assert end_backends("datname = current_database()", []) >= IDLE

    assert Job.objects.count() == 0  # on a new connection, at once


def last_query_of(pid: int) -> str:
    with dedicated_connection() as admin:
        return admin.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0]


@pytest.mark.django_db
def test_an_idle_connection_nothing_arrived_on_is_handed_out_without_a_round_trip():
    """psycopg_pool's check sends an empty query each time it hands a connection out; jobsite's sends one only when
    something arrived on the idle connection (PostgreSQL ending it says so), and sweeps then as before."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    pool = ConnectionPool(kwargs={**params, "autocommit": True}, min_size=1, max_size=1, timeout=30,
                          check=dbpool.check_connection, open=True)
    try:
        marker = f"SELECT 'handed out as it is {uuid.uuid4().hex}'"
        with pool.connection() as conn:
            conn.execute(marker)
            pid = conn.info.backend_pid
        for _ in range(3):
            with pool.connection() as conn:
                assert conn.info.backend_pid == pid
        assert last_query_of(pid) == marker  # psycopg_pool's check leaves "" here

        assert end_backends("pid = %s", [pid]) == 1
        with pool.connection() as conn:  # the ended one is found and replaced at once
            assert conn.info.backend_pid != pid and conn.execute("SELECT 1").fetchone() == (1,)
        assert pool.get_stats()["connections_lost"] == 1
    finally:
        pool.close()
