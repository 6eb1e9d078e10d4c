"""What every jobsite API view shares: request bodies over the API's limit refused before they are read."""

from __future__ import annotations

from rest_framework.request import Request

from ..body_limit import body_size_check


class ApiMixin:
    """What every jobsite API view shares: bodies of at most JOBSITE_API_MAX_BODY_BYTES (``jobs.api.body_limit``,
    1 MiB by default), refused before they are read."""

    def initial(self, request: Request, *args, **kwargs) -> None:
        super().initial(request, *args, **kwargs)
        body_size_check(request)
