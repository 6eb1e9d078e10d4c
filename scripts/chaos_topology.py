"""The chaos run's processes: those of `make prod`, each in its own process group, killed and started again; and
the HTTP calls that reach them while they may be down."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv" / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Killed:
    at: float  # seconds after the first submit, when the kill -9 was sent
    victim: str


class Topology:
    """The processes of `make prod`, each in its own process group, so one can be killed and started again."""

    def __init__(self, env: dict[str, str], var: Path, port: int):
        self.env, self.var, self.port = env, var, port
        self.base = f"http://127.0.0.1:{port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.down: set[str] = set()  # killed on purpose, not started again yet
        self.unexpected: Counter[str] = Counter()
        self.killed: list[Killed] = []  # every kill made, in order (read by the sampler while the run goes on)
        self.lock = threading.Lock()

    def argv(self, name: str) -> list[str]:
        return {
            "web": [str(VENV / "uvicorn"), "jobsite.asgi:application", "--host", "127.0.0.1", "--port",
                    str(self.port), "--no-access-log"],
            "scheduler": [str(VENV / "python"), "manage.py", "runscheduler"],
            "scheduler-2": [str(VENV / "python"), "manage.py", "runscheduler"],
            "worker": [str(VENV / "celery"), "-A", "jobsite", "worker", "--beat", "--loglevel", "INFO",
                       "--concurrency", "2", "--without-gossip", "--without-mingle", "--schedule",
                       str(self.var / "celerybeat-schedule")],
        }[name]

    def start(self, name: str) -> None:
        with self.lock:
            log = open(self.var / f"{name}.log", "ab")
            self.procs[name] = subprocess.Popen(self.argv(name), cwd=ROOT, env=self.env_of(name), stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)
            log.close()
            self.down.discard(name)

    def env_of(self, name: str) -> dict[str, str]:
        """The second scheduler (a standby, as `make prod` runs one) serves its /readyz on the next port."""
        if name != "scheduler-2":
            return self.env
        return {**self.env, "JOBSITE_SCHEDULER_HTTP_PORT": str(int(self.env["JOBSITE_SCHEDULER_HTTP_PORT"]) + 1)}

    def schedulers(self) -> list[str]:
        return [name for name in self.procs if name.startswith("scheduler")]

    def leader(self) -> str | None:
        """The scheduler process that leads now (its /readyz says so), if any answers that it does."""
        for name in self.schedulers():
            port = self.env_of(name)["JOBSITE_SCHEDULER_HTTP_PORT"]
            try:
                status, body = request(f"http://127.0.0.1:{port}", "GET", "/readyz", timeout=5.0)
            except OSError:
                continue
            if status == 200 and json.loads(body).get("leader"):
                return name
        return None

    def kill(self, name: str, at: float) -> str:
        """kill -9 the process group of ``name``; ``at``: seconds after the first submit, recorded. With a standby,
        "scheduler" means the one leading (the kill that costs something). Returns the name of the one killed."""
        if name == "scheduler" and len(self.schedulers()) > 1:
            name = self.leader() or name
        with self.lock:
            self.down.add(name)
            proc = self.procs[name]
            self.killed.append(Killed(at, name))
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        return name

    def watch(self) -> None:
        """Start again what died without being killed on purpose (counted: a process must not die by itself)."""
        for name, proc in list(self.procs.items()):
            if name not in self.down and proc.poll() is not None:
                self.unexpected[name] += 1
                self.start(name)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def request(base: str, method: str, path: str, body=None, token=None, key=None, timeout=30.0):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    if key:
        headers["Idempotency-Key"] = key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def until_answered(stop_at: float, fn, what: str, server_errors: list[str] | None = None):
    """Call ``fn`` until it answers (the web may be down or restarting): a connection error or a 5xx is retried;
    each 5xx is also appended to ``server_errors`` (an error the server answered: counted, never expected)."""
    last = None
    while time.monotonic() < stop_at:
        try:
            status, body = fn()
            if status < 500:
                return status, body
            last = f"HTTP {status}: {body[:200]!r}"
            if server_errors is not None:
                server_errors.append(f"{what}: {last}")
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.3)
    raise RuntimeError(f"{what}: no answer before the deadline ({last})")
