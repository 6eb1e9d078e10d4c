"""The production web server: ``python -m jobsite.serve_web [uvicorn options]``.

uvicorn serving ``jobsite.asgi:application`` with ``JOBSITE_WEB_WORKERS`` processes (default 1) behind one port; the
processes share nothing but the database, Redis (the channel layer carries every live change to each process's hub,
``jobs.live_hub``; the cache) and the directory of prometheus_client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``, default ``<temporary directory>/jobsite-web-metrics``), emptied here before they
start, from which ``/metrics`` adds up the counters of all of them (``jobs.metrics``). WebSocket frames are sent
without per-message compression (the live pages send the same small frames to many sockets: ``jobs.live_list``).
Each process runs ``jobsite.accept_gate.GatedLoop``: it takes the port's connections only while it has room for
their requests, so the processes share one queue (the port's) instead of each keeping its own.
Used by ``make prod`` (scripts/run-prod.sh), the image's default command and deploy/base/web.yaml.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULT_OPTIONS = ["--ws-per-message-deflate", "false", "--no-access-log", "--loop", "jobsite.accept_gate:GatedLoop"]


def prepare_metrics_dir(environ: dict[str, str]) -> Path:
    """The multiprocess directory, created empty (files of processes of an earlier run would be added up too)."""
    path = Path(environ.setdefault("PROMETHEUS_MULTIPROC_DIR",
                                   str(Path(tempfile.gettempdir()) / "jobsite-web-metrics")))
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True, mode=0o700)
    return path


def command(argv: list[str], environ: dict[str, str]) -> list[str]:
    workers = int(environ.get("JOBSITE_WEB_WORKERS", "1"))
    if workers < 1:
        raise SystemExit("JOBSITE_WEB_WORKERS must be 1 or more")
    if workers > 1 and not environ.get("REDIS_URL"):  # the in-memory layer reaches the sockets of one process
        raise SystemExit("JOBSITE_WEB_WORKERS above 1 needs REDIS_URL (the channel layer between the processes)")
    return [sys.executable, "-m", "uvicorn", "jobsite.asgi:application", "--workers", str(workers),
            *DEFAULT_OPTIONS, *argv]


def main() -> None:
    environ = os.environ
    prepare_metrics_dir(environ)  # in os.environ: the workers inherit it
    args = command(sys.argv[1:], dict(environ))
    os.execv(args[0], args)


if __name__ == "__main__":
    main()
