"""Response headers that keep the pages' own code the only code they run: a Content-Security-Policy on every
response that has none (JOBSITE_CSP). The pages load scripts and styles from /static/ only and have no inline
scripts (the API docs load their init script from a URL too); style attributes stay allowed (bar widths)."""

from __future__ import annotations

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
