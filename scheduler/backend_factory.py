"""Building the backends of this process, one per name, with what the scheduler hands them: the log layout the
web reads replica logs by (``jobs.logs``), so that no backend imports ``jobs``."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from jobs.logs import replica_log_path

from .backends.base import Backend

if TYPE_CHECKING:
    from .backends.kubernetes import KubernetesBackend
    from .backends.local import LocalBackend


def get_backend(name: str | None = None) -> Backend:
    """The backend called ``name`` (default: JOBSITE_BACKEND), one instance per process and name."""
    return _backend(name or settings.JOBSITE_BACKEND)


@cache
def _backend(name: str) -> Backend:
    if name == "local":
        return local_backend()
    if name == "kubernetes":
        return kubernetes_backend()
    raise ValueError(f"Unknown JOBSITE_BACKEND '{name}' (expected 'local' or 'kubernetes')")


get_backend.cache_clear = _backend.cache_clear  # type: ignore[attr-defined]


def local_backend(root: Path | str | None = None, node: str | None = None, gpus: int | None = None) -> LocalBackend:
    """A local backend of its own (``get_backend`` keeps the process's)."""
    from .backends.local import LocalBackend

    return LocalBackend(Path(root) if root is not None else None, node, gpus, log_layout=replica_log_path)


def kubernetes_backend(api_client: Any = None, *, namespace: str | None = None,
                       log_root: Path | str | None = None) -> KubernetesBackend:
    """A Kubernetes backend of its own (``get_backend`` keeps the process's)."""
    from .backends.kubernetes import KubernetesBackend

    return KubernetesBackend(api_client, namespace=namespace, log_root=log_root, log_layout=replica_log_path)
