"""CLI tests: the real `jobctl` console script (installed into the virtualenv by `pip install -e .`, which the
Makefile's venv step runs) against pytest-django's live server, with its own config directory."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

JOBCTL = Path(sys.executable).parent / "jobctl"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Jobctl:
    def __init__(self, url: str, home: Path):
        self.url = url
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "JOBSITE_URL", "XDG_CONFIG_HOME")}
        self.env.update({"JOBSITE_URL": url, "XDG_CONFIG_HOME": str(home / "config"), "HOME": str(home)})

    @property
    def config_file(self) -> Path:
        return self.home / "config" / "jobctl" / "config.json"

    def __call__(self, *args: str, input: str | None = None, env: dict | None = None,
                 timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(JOBCTL), *args], input=input, capture_output=True, text=True, timeout=timeout,
                              env={**self.env, **(env or {})})

    def popen(self, *args: str, stderr=subprocess.PIPE) -> subprocess.Popen:
        return subprocess.Popen([str(JOBCTL), *args], stdout=subprocess.PIPE, stderr=stderr, text=True,
                                env=self.env)

    def json(self, *args: str):
        result = self(*args, "-o", "json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture
def jobctl(live_server, world, tmp_path) -> Jobctl:
    if not JOBCTL.exists():
        pytest.fail(f"{JOBCTL} is missing: install the project into the virtualenv (pip install --no-deps -e .)")
    return Jobctl(live_server.url, tmp_path)


@pytest.fixture
def bob(jobctl) -> Jobctl:
    """jobctl logged in as bob."""
    result = jobctl("login", "--username", "bob", "--password", "pw-bob")
    assert result.returncode == 0, result.stderr
    return jobctl
