from __future__ import annotations

from functools import cache

from django.conf import settings

from .base import Backend


@cache
def get_backend(name: str | None = None) -> Backend:
    name = name or settings.JOBSITE_BACKEND
    if name == "local":
        from .local import LocalBackend

        return LocalBackend()
    raise ValueError(f"Unknown JOBSITE_BACKEND '{name}' (expected 'local')")
