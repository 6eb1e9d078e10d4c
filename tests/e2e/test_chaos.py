"""The chaos suite in its short form: the production topology, 40 jobs, three kill -9s, the recovery timeouts
shortened (scripts/chaos.py --fast)."""

import os
import subprocess
import sys

import psycopg
import pytest

from .servers import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FIGURES = ["lost", "stuck", "double attempts", "orphan processes", "overcommit samples", "trail holes"]
# What the kills cost: printed with their goals, not asserted (they depend on the machine's load).
COSTS = ["idle GPU-seconds", "longest queue stall", "wall time"]


def test_kill_9_of_scheduler_worker_and_web_loses_nothing(tmp_path):
    database = f"jobsite_chaostest_{os.getpid()}"
    try:
        # Generous: on a busy 2-core machine the topology starts slowly and every restart takes seconds.
        run = subprocess.run([sys.executable, "scripts/chaos.py", "--seed", "7", "--jobs", "40", "--kills", "3",
                              "--fast", "--deadline", "600", "--database", database,
                              "--redis", "redis://127.0.0.1:6379/12", "--var", str(tmp_path)],
                             cwd=ROOT, capture_output=True, text=True, timeout=1500)
    finally:
        with psycopg.connect("postgres://postgres@127.0.0.1:5432/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    out = run.stdout + run.stderr
    assert "seed 7" in out
    for figure in FIGURES:  # each printed, each 0
        line = next((x for x in out.splitlines() if x.strip().startswith(figure)), None)
        assert line is not None and line.split()[len(figure.split())] == "0", out
    for cost in COSTS:
        assert any(x.strip().startswith(cost) for x in out.splitlines()), out
    assert run.returncode == 0, out
