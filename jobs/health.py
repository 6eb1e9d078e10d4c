"""The web app's /healthz: 200 "ok" while the default database answers, 503 otherwise. No authentication, and no
session is touched (no cookie set), so load balancers and probes can call it freely.

Kubelet probes and Prometheus call the pod's IP, a Host that ALLOWED_HOSTS does not list, over plain HTTP:
``ProbeMiddleware``, first in MIDDLEWARE, answers /healthz, and /metrics for a scraper (a bearer token, or any
request while /metrics is open: ``jobsite.security.metrics_refusal``), before the host check and the HTTPS
redirect could turn them away. A browser's /metrics (a staff session) goes through the whole stack."""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from jobsite.security import metrics_refusal

log = logging.getLogger(__name__)


def database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except DatabaseError:
        log.warning("healthz: the database does not answer", exc_info=True)
        return False


@never_cache
@require_safe
def healthz(request: HttpRequest) -> HttpResponse:
    if database_ok():
        return HttpResponse("ok", content_type="text/plain")
    return HttpResponse("database unavailable", status=503, content_type="text/plain")


class ProbeMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.path == "/healthz":
            return healthz(request)
        if request.path == "/metrics" and (request.headers.get("Authorization", "").lower().startswith("bearer ")
                                           or metrics_refusal("") is None):
            from .metrics import metrics_view

            return metrics_view(request)
        return self.get_response(request)
