"""Response headers that keep the pages' own code the only code they run: a Content-Security-Policy on every
response that has none (JOBSITE_CSP). The pages load scripts and styles from /static/ only and have no inline
scripts (the API docs load their init script from a URL too); style attributes stay allowed (bar widths).

Also who may read /metrics (``metrics_refusal``), one rule for the web process and the scheduler's HTTP port."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response
        self.policy = settings.JOBSITE_CSP

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if self.policy:
            response.headers.setdefault("Content-Security-Policy", self.policy)
        return response


# --- /metrics: who may scrape (the web's jobs.metrics and the scheduler's scheduler.http alike) ----------------------

METRICS_CLOSED = ("/metrics is closed: in production it needs JOBSITE_METRICS_TOKEN (scrapers send "
                  "`Authorization: Bearer <token>`), or JOBSITE_METRICS_PUBLIC=true to open it to anyone who can "
                  "reach it")


def metrics_refusal(authorization: str, *, authenticated: bool = False, staff: bool = False) -> tuple[int, str] | None:
    """None when a scrape with this ``Authorization`` header (and session) may read /metrics; else (status, text).

    Open when JOBSITE_METRICS_PUBLIC is true, or outside production with no token set (the embedded default).
    Otherwise a bearer token equal to JOBSITE_METRICS_TOKEN (compared in constant time) or a staff session is
    needed: a signed-in non-staff user gets 403, anyone else 401. In production with no token set nothing but a
    staff session gets in: 403, saying how to open it."""
    token = settings.JOBSITE_METRICS_TOKEN
    if settings.JOBSITE_METRICS_PUBLIC or (not token and not settings.JOBSITE_PRODUCTION):
        return None
    scheme, _, given = (authorization or "").partition(" ")
    given = given.strip()
    if token and scheme.lower() == "bearer" and given and hmac.compare_digest(given.encode(), token.encode()):
        return None
    if staff:
        return None
    if not token:
        return 403, METRICS_CLOSED + "\n"
    if authenticated:
        return 403, "metrics are for staff or a bearer token\n"
    return 401, "a bearer token is required\n"


def metrics_access_summary() -> tuple[int, str]:
    """(logging level, sentence) saying at start who may read /metrics."""
    if settings.JOBSITE_METRICS_PUBLIC:
        return logging.WARNING, "/metrics is open to anyone who can reach it (JOBSITE_METRICS_PUBLIC=true)"
    if settings.JOBSITE_METRICS_TOKEN:
        return logging.INFO, "/metrics needs its bearer token (JOBSITE_METRICS_TOKEN)"
    if settings.JOBSITE_PRODUCTION:
        return logging.WARNING, METRICS_CLOSED
    return logging.INFO, "/metrics is open (embedded default, no JOBSITE_METRICS_TOKEN)"
