"""Dependencies point one way: jobs/ (the domain, web, API) imports nothing from scheduler/, and the backends
(scheduler/backends) import nothing from jobs/."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.fast


def test_no_module_of_jobs_names_scheduler_in_an_import():
    offenders = []
    for path in sorted((ROOT / "jobs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                          if n == "scheduler" or n.startswith("scheduler.")]
    assert offenders == []


@pytest.mark.slow  # a fresh interpreter
def test_importing_every_module_of_jobs_loads_no_scheduler_module():
    script = """
import importlib, json, pkgutil, sys
import django
django.setup()
before = {m for m in sys.modules if m == "scheduler" or m.startswith("scheduler.")}
import jobs
for info in pkgutil.walk_packages(jobs.__path__, "jobs."):
    if ".migrations." not in info.name and not info.name.endswith(".migrations"):
        importlib.import_module(info.name)
after = {m for m in sys.modules if m == "scheduler" or m.startswith("scheduler.")}
print(json.dumps({"before": sorted(before), "new": sorted(after - before)}))
"""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "jobsite.settings"}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["new"] == []
    # Django loads the scheduler app's config, and nothing else of it, when it starts.
    assert set(result["before"]) <= {"scheduler", "scheduler.apps"}


def _imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """Every absolute import in a module, at any depth (imports inside functions count)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.lineno, node.module or ""))
    return found


def test_no_module_of_the_backends_names_jobs_in_an_import():
    """A backend is hands: it launches, stops, observes and lists, and never reaches into the database or the
    services, not even through an import inside a function."""
    offenders = []
    for path in sorted((ROOT / "scheduler" / "backends").rglob("*.py")):
        for lineno, name in _imported_names(ast.parse(path.read_text(), filename=str(path))):
            if name == "jobs" or name.startswith("jobs."):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno} {name}")
    assert offenders == []


@pytest.mark.slow  # a fresh interpreter
def test_importing_every_backend_module_loads_no_jobs_module():
    script = """
import importlib, json, pkgutil, sys
import django
django.setup()
before = {m for m in sys.modules if m == "jobs" or m.startswith("jobs.")}
import scheduler.backends
for info in pkgutil.walk_packages(scheduler.backends.__path__, "scheduler.backends."):
    importlib.import_module(info.name)
after = {m for m in sys.modules if m == "jobs" or m.startswith("jobs.")}
print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith("scheduler.backends.")),
                  "new": sorted(after - before)}))
"""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "jobsite.settings"}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert "scheduler.backends.kubernetes" in result["modules"] and "scheduler.backends.local" in result["modules"]
    assert result["new"] == []
