"""The database pool's check of a connection before handing it out (settings: DATABASES' pool options).

psycopg_pool's own check discards a dead connection and tries the next one, but it sleeps between failed checks
with an exponential backoff (none, 1 s, 2 s, 4 s, 8 s, 16 s): after PostgreSQL ended every connection (a restart,
a failover, the chaos run's kills), a pool holding seven idle dead connections made the thread that asked for one
wait out its whole 30 s timeout and fail, though the server was up again. When one connection is found dead, the
others idle beside it most likely are too: this check then sweeps the whole pool at once (each dead one fails at
once, and the pool opens replacements), so the asker's next try gets a live connection instead of backing off.

A connection is checked with a round trip (psycopg_pool's empty query) only when something has arrived on it while
it was idle: PostgreSQL ending a connection (a restart, ``pg_terminate_backend``, a backend's crash) sends its
reason and closes the socket, which then reads as ready. An idle connection on which nothing arrived is handed out
as it is: the round trip cost a request about as much CPU, in the web process and in PostgreSQL, as one of its
queries.
"""

from __future__ import annotations

import logging
import select
from typing import Any

from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

log = logging.getLogger(__name__)


def check_connection(conn: Any) -> None:
    """Raise if ``conn`` is dead, after sweeping the dead ones out of its pool."""
    if _quiet(conn):
        return
    try:
        ConnectionPool.check_connection(conn)
    except Exception:
        # The pool marks a connection it hands out with itself (psycopg's Connection._pool) before checking it.
        pool = getattr(conn, "_pool", None)
        if isinstance(pool, ConnectionPool):
            log.warning("a pooled database connection was dead: checking every idle one")
            pool.check()  # tests each idle connection with psycopg_pool's plain check; replaces the dead ones
        raise


def _quiet(conn: Any) -> bool:
    """``conn`` is open, idle, and nothing has arrived on it since its last answer."""
    if conn.closed or conn.broken or conn.info.transaction_status != TransactionStatus.IDLE:
        return False
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except (OSError, ValueError):  # no socket to poll
        return False
