"""The database pool's check of a connection before handing it out (settings: DATABASES' pool options).

psycopg_pool's own check discards a dead connection and tries the next one, but it sleeps between failed checks
with an exponential backoff (none, 1 s, 2 s, 4 s, 8 s, 16 s): after PostgreSQL ended every connection (a restart,
a failover, the chaos run's kills), a pool holding seven idle dead connections made the thread that asked for one
wait out its whole 30 s timeout and fail, though the server was up again. When one connection is found dead, the
others idle beside it most likely are too: this check then sweeps the whole pool at once (each dead one fails at
once, and the pool opens replacements), so the asker's next try gets a live connection instead of backing off.
"""

from __future__ import annotations

import logging
from typing import Any

from psycopg_pool import ConnectionPool

log = logging.getLogger(__name__)


def check_connection(conn: Any) -> None:
    """Raise if ``conn`` is dead, after sweeping the dead ones out of its pool."""
    try:
        ConnectionPool.check_connection(conn)
    except Exception:
        # The pool marks a connection it hands out with itself (psycopg's Connection._pool) before checking it.
        pool = getattr(conn, "_pool", None)
        if isinstance(pool, ConnectionPool):
            log.warning("a pooled database connection was dead: checking every idle one")
            pool.check()  # tests each idle connection with psycopg_pool's plain check; replaces the dead ones
        raise
