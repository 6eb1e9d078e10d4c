from __future__ import annotations

from functools import cache

from django.conf import settings

from .base import Backend


def get_backend(name: str | None = None) -> Backend:
    """The backend called ``name`` (default: JOBSITE_BACKEND), one instance per process and name."""
    return _backend(name or settings.JOBSITE_BACKEND)


@cache
def _backend(name: str) -> Backend:
    if name == "local":
        from .local import LocalBackend

        return LocalBackend()
    if name == "kubernetes":
        from .kubernetes import KubernetesBackend

        return KubernetesBackend()
    raise ValueError(f"Unknown JOBSITE_BACKEND '{name}' (expected 'local' or 'kubernetes')")


get_backend.cache_clear = _backend.cache_clear  # type: ignore[attr-defined]
