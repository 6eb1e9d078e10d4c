"""Dependencies point one way: jobs/ (the domain, web, API) imports nothing from scheduler/."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
