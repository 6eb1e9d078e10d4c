"""Settings of the local backend's launcher (``scheduler/backends/launcher.py``), imported at the end of
``jobsite.settings``: one long-lived process per backend root that forks each replica's supervisor, instead of a
Python interpreter started per replica."""

from __future__ import annotations

import environ

__all__ = ["JOBSITE_LOCAL_LAUNCHER", "JOBSITE_LOCAL_LAUNCHER_IDLE_SECONDS"]
_env = environ.Env()

# Off: every replica's supervisor is an interpreter of its own (what a launcher that cannot start falls back to).
JOBSITE_LOCAL_LAUNCHER = _env.bool("JOBSITE_LOCAL_LAUNCHER", default=True)
# A launcher with nothing to start this long exits (the next launch starts another).
JOBSITE_LOCAL_LAUNCHER_IDLE_SECONDS = _env.float("JOBSITE_LOCAL_LAUNCHER_IDLE_SECONDS", default=600.0)
