"""Settings of the web process's request threads (``jobsite/asgi_handler.py``), imported at the end of
``jobsite.settings``."""

from __future__ import annotations

import environ

__all__ = ["JOBSITE_WEB_THREADS"]
_env = environ.Env()

# How many requests one web process works on at once, each in a thread of a pool kept for the process (as a WSGI
# server's); more wait for a free thread. Without the database pool, a thread keeps its connection (CONN_MAX_AGE).
# With several processes behind one port, a process takes no new connection while it has this many requests in hand
# (jobsite/accept_gate.py): the others wait in the port's queue for the first process with room. 8: a submit's
# p95 under 50 back-to-back submitters was lower than with 16 (the threads of a process share one interpreter lock)
# and its throughput the same; keep it at or under JOBSITE_DB_POOL_MAX (10), or requests wait for a connection too.
JOBSITE_WEB_THREADS = _env.int("JOBSITE_WEB_THREADS", default=8)
