"""The scheduler process's own small HTTP server (JOBSITE_SCHEDULER_HTTP_PORT): /metrics, /healthz, /readyz.

- ``/metrics``: prometheus_client's default REGISTRY (the scheduler's metrics), for ``Authorization: Bearer
  <JOBSITE_METRICS_TOKEN>`` (in production; or anyone with JOBSITE_METRICS_PUBLIC): ``jobsite.security``;
- ``/healthz``: 200 while the loop beats (``health.beat()``) at least every max(30 s, 10 × the scheduler interval),
  and during the first 60 s after start; 503 otherwise (liveness: a wedged loop gets the pod restarted);
- ``/readyz``: 200 ``{"leader": true|false}``: a standby is ready too.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from jobsite.security import metrics_access_summary, metrics_refusal

from . import health

log = logging.getLogger(__name__)

STARTUP_GRACE_SECONDS = 60.0
MIN_STALE_SECONDS = 30.0


def stale_after() -> float:
    """Seconds without a beat after which the loop counts as stuck."""
    try:
        from django.conf import settings

        interval = float(settings.JOBSITE_SCHEDULER_INTERVAL)
    except Exception:
        interval = 1.0
    return max(MIN_STALE_SECONDS, 10.0 * interval)


def liveness() -> tuple[bool, str]:
    """(alive, text) for /healthz."""
    age = health.seconds_since_beat()
    if age is not None and age <= stale_after():
        return True, "ok"
    since_start = health.seconds_since_start()
    if since_start is not None and since_start < STARTUP_GRACE_SECONDS:
        return True, "ok"
    if age is None:
        return False, "the scheduler loop has not finished a round"
    return False, f"the scheduler loop has not finished a round for {age:.0f} s"


class _Handler(BaseHTTPRequestHandler):
    server_version = "jobsite-scheduler"

    def do_GET(self) -> None:
        self._respond(with_body=True)

    def do_HEAD(self) -> None:
        self._respond(with_body=False)

    def _respond(self, with_body: bool) -> None:
        path = urlsplit(self.path).path
        try:
            refusal = metrics_refusal(self.headers.get("Authorization") or "") if path == "/metrics" else None
            if refusal is not None:
                status, content_type, body = refusal[0], "text/plain; charset=utf-8", refusal[1].encode()
            elif path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept") or "")
                status, body = 200, encoder(REGISTRY)
            elif path == "/healthz":
                alive, text = liveness()
                status, content_type, body = (200 if alive else 503), "text/plain; charset=utf-8", text.encode()
            elif path == "/readyz":
                status, content_type = 200, "application/json"
                body = json.dumps({"leader": health.is_leader()}).encode()
            else:
                status, content_type, body = 404, "text/plain; charset=utf-8", b"not found"
        except Exception:
            log.exception("scheduler http: %s failed", path)
            status, content_type, body = 500, "text/plain; charset=utf-8", b"internal error"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="metrics"')
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        log.debug("scheduler http: %s - %s", self.address_string(), format % args)


class SchedulerHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    _thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server_address[1]

    def shutdown(self) -> None:
        """Stop serving and close the socket (call from another thread than the server's)."""
        super().shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def start_http_server(port: int, addr: str = "0.0.0.0") -> SchedulerHTTPServer:
    """Serve on ``addr:port`` from a daemon thread; port 0 picks a free port (see ``.port``)."""
    server = SchedulerHTTPServer((addr, port), _Handler)
    if health.seconds_since_start() is None:
        health.started()  # the grace period runs from here until the loop calls started() itself
    server._thread = threading.Thread(target=server.serve_forever, name="scheduler-http", daemon=True)
    server._thread.start()
    log.info("scheduler http: serving /metrics, /healthz and /readyz on %s:%d", addr, server.port)
    log.log(*metrics_access_summary())
    return server


def start_from_settings() -> SchedulerHTTPServer | None:
    """Start on JOBSITE_SCHEDULER_HTTP_PORT; None when it is 0 (off) or the port cannot be bound (logged)."""
    from django.conf import settings

    port = int(getattr(settings, "JOBSITE_SCHEDULER_HTTP_PORT", 0) or 0)
    if not port:
        return None
    try:
        return start_http_server(port)
    except OSError:
        log.exception("scheduler http: cannot listen on port %d; no /metrics, /healthz or /readyz", port)
        return None
