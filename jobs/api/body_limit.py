"""The API's limit on request bodies: JOBSITE_API_MAX_BODY_BYTES, the check every API view makes, and its wording.

The ASGI edge (``jobsite.limits``, JOBSITE_MAX_BODY_BYTES) refuses far larger bodies for the whole site; the API
takes at most this much, refused (413) from Content-Length before the body is parsed.
"""

from __future__ import annotations

from django.conf import settings
from rest_framework.request import Request

from .exceptions import RequestTooLarge


def max_body_bytes() -> int:
    """The largest request body the API accepts, in bytes."""
    return settings.JOBSITE_API_MAX_BODY_BYTES


def max_body_text() -> str:
    """The limit as a person reads it: ``1 MiB``, ``512 KiB``, or a number of bytes."""
    limit = max_body_bytes()
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if limit >= size and limit % size == 0:
            return f"{limit // size} {unit}"
    return f"{limit} bytes"


def body_size_check(request: Request) -> None:
    """Refuse (413) a request whose Content-Length is over the limit, before its body is read."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    limit = max_body_bytes()
    if length > limit:
        raise RequestTooLarge(f"The request body is {length} bytes; at most {limit} are accepted.")
