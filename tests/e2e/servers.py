"""Real servers, started as a user starts them: `make run` (embedded, fresh SQLite) and `make prod`."""

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from .api import free_port

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 180  # seconds for `make run` / `make prod` to answer its first request


@contextmanager
def serving(argv: list[str], env: dict[str, str], log_file: Path, port: int, what: str):
    """Start ``argv`` in its own process group, wait until it answers /login/ on ``port``, yield its URL, then stop
    the whole group."""
    log = open(log_file, "wb")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    # Generous: on a busy 2-core machine `make prod` migrates, collects static files and seeds before it serves,
    # and the first request (imports, the first database connections) can take many seconds.
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(base + "/login/", timeout=min(30, max(1, deadline - time.monotonic())))
            break
        except (urllib.error.URLError, OSError):  # refused, reset, or a read that timed out (TimeoutError)
            time.sleep(0.3)
    try:
        if proc.poll() is not None or time.monotonic() >= deadline:
            pytest.fail(f"{what} did not serve:\n" + log_file.read_text()[-5000:])
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@contextmanager
def make_server(target: str, var_dir: Path, **extra_env: str):
    """Run `make <target>` as a user would, wait until it answers, yield its URL, then stop it."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(PORT=str(port), JOBSITE_VAR_DIR=str(var_dir), DEMO_PASSWORD="smoke-pass",
               JOBSITE_LOCAL_USE_NVIDIA_SMI="false", **extra_env)
    var_dir.mkdir(parents=True, exist_ok=True)
    with serving(["make", "--no-print-directory", target], env, var_dir.parent / f"{target}.log", port,
                 f"make {target}") as base:
        yield base
