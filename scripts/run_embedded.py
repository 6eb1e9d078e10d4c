#!/usr/bin/env python
"""`make run`: prepare the embedded setup and serve it, all in one process (Django is set up once).

Before serving: migrations (only when some are unapplied: the plan is read from disk, no migrate run otherwise),
static files (collected only when a source file was added, removed or changed since the last collection, recorded
in ``$JOBSITE_VAR_DIR/staticfiles.stamp``) and the demo data (``seed_demo``, idempotent: a few queries). Each step
prints how long it took (``--quiet-steps`` keeps only what it did); then ``manage.py serve`` runs in this process.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTED = time.monotonic()


def say(message: str) -> None:
    print(f"jobsite: [{time.monotonic() - STARTED:5.1f}s] {message}", flush=True)


def unapplied_migrations() -> list[str]:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _ in plan]


def static_fingerprint() -> str:
    """A digest of every source static file's path, size and modification time (what collectstatic would copy)."""
    from django.contrib.staticfiles.finders import get_finders

    digest = hashlib.sha256()
    entries = []
    for finder in get_finders():
        for path, storage in finder.list(["CVS", ".*", "*~"]):
            stat = os.stat(storage.path(path))
            prefix = getattr(storage, "prefix", None) or ""
            entries.append(f"{prefix}/{path}\0{stat.st_size}\0{stat.st_mtime_ns}")
    for entry in sorted(entries):
        digest.update(entry.encode() + b"\n")
    return digest.hexdigest()


def prepare() -> None:
    from django.conf import settings
    from django.core.management import call_command

    pending = unapplied_migrations()
    if pending:
        say(f"applying {len(pending)} migrations (first start: a fresh database)")
        call_command("migrate", interactive=False, verbosity=1)
    say("database schema up to date")

    stamp = Path(settings.VAR_DIR) / "staticfiles.stamp"
    fingerprint = static_fingerprint()
    if not Path(settings.STATIC_ROOT).is_dir() or not stamp.is_file() or stamp.read_text() != fingerprint:
        say("collecting static files")
        call_command("collectstatic", interactive=False, verbosity=0)
        stamp.write_text(fingerprint)
    say("static files up to date")

    call_command("seed_demo")
    say("demo data ready")


def main() -> None:
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
    import django

    django.setup()
    say("settings and apps loaded")
    prepare()
    from django.core.management import call_command
    from django.db import connections

    connections.close_all()
    call_command("serve")


if __name__ == "__main__":
    main()
