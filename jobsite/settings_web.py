"""Settings of the web process's request threads (``jobsite/asgi_handler.py``), imported at the end of
``jobsite.settings``."""

from __future__ import annotations

import environ

__all__ = ["JOBSITE_WEB_THREADS"]
_env = environ.Env()

# How many requests one web process works on at once, each in a thread of a pool kept for the process (as a WSGI
# server's); more wait for a free thread. Without the database pool, a thread keeps its connection (CONN_MAX_AGE).
JOBSITE_WEB_THREADS = _env.int("JOBSITE_WEB_THREADS", default=16)
