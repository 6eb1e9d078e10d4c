"""Any other path under /api/v1/: a 404 in the API's error shape, not an HTML page."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, permissions
from rest_framework.request import Request
from rest_framework.views import APIView

from .base import ApiMixin


@extend_schema(exclude=True)
class NotFoundApi(ApiMixin, APIView):
    """Any other path under /api/v1/ ending in a slash: a 404 in the API's error shape, not an HTML page."""

    permission_classes = [permissions.AllowAny]
    authentication_classes: list = []

    def get(self, request: Request, *args, **kwargs):
        raise exceptions.NotFound(f"No API endpoint at {request.path}.")

    post = put = patch = delete = get
