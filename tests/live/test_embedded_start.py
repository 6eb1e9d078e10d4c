"""`make run` prepares in its serving process (scripts/run_embedded.py) and skips what is already done: static files
are collected again only when a source file changed, migrations run only when some are unapplied, and the demo
data is there after every start."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from django.contrib.staticfiles.finders import get_finder

from jobs.models import Group, Membership

pytestmark = [pytest.mark.fast, pytest.mark.django_db]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "run_embedded.py"


@pytest.fixture
def run_embedded():
    spec = importlib.util.spec_from_file_location("run_embedded", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def static_setup(settings, tmp_path):
    source = tmp_path / "static-src"
    source.mkdir()
    (source / "app.css").write_text("body { color: black }")
    settings.VAR_DIR = tmp_path / "var"
    settings.VAR_DIR.mkdir()
    settings.STATIC_ROOT = tmp_path / "var" / "staticfiles"
    settings.STATICFILES_DIRS = [source]
    settings.STATICFILES_FINDERS = ["django.contrib.staticfiles.finders.FileSystemFinder"]
    get_finder.cache_clear()
    yield source
    get_finder.cache_clear()


def steps(capsys) -> str:
    return capsys.readouterr().out


def test_a_warm_start_collects_nothing_and_a_changed_file_is_collected_again(run_embedded, static_setup, settings,
                                                                               capsys):
    run_embedded.prepare()
    first = steps(capsys)
    assert "collecting static files" in first
    assert (Path(settings.STATIC_ROOT) / "app.css").read_text() == "body { color: black }"
    assert "applying" not in first  # the test database is migrated already

    run_embedded.prepare()
    assert "collecting static files" not in steps(capsys)

    changed = static_setup / "app.css"
    changed.write_text("body { color: red }")
    stat = changed.stat()
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    run_embedded.prepare()
    assert "collecting static files" in steps(capsys)
    assert (Path(settings.STATIC_ROOT) / "app.css").read_text() == "body { color: red }"


def test_static_files_are_collected_again_when_the_collected_ones_are_gone(run_embedded, static_setup, settings,
                                                                          capsys):
    import shutil

    run_embedded.prepare()
    shutil.rmtree(settings.STATIC_ROOT)
    steps(capsys)
    run_embedded.prepare()
    assert "collecting static files" in steps(capsys)
    assert (Path(settings.STATIC_ROOT) / "app.css").is_file()


def test_every_start_leaves_the_demo_data_in_place(run_embedded, static_setup):
    run_embedded.prepare()
    Membership.objects.filter(group__name="research").delete()
    run_embedded.prepare()
    assert set(Group.objects.values_list("name", flat=True)) >= {"phusers", "research"}
    assert Membership.objects.filter(group__name="research", user__username="lin").exists()


def test_unapplied_migrations_are_listed_by_name(run_embedded):
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    assert run_embedded.unapplied_migrations() == []
    recorder = MigrationRecorder(connection)
    last = recorder.migration_qs.filter(app="sessions").order_by("-id").first()
    last.delete()
    try:
        assert run_embedded.unapplied_migrations() == [f"sessions.{last.name}"]
    finally:
        recorder.record_applied("sessions", last.name)
