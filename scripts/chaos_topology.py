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
            "worker": [str(VENV / "celery"), "-A", "jobsite", "worker", "--beat", "--loglevel", "INFO",
                       "--concurrency", "2", "--without-gossip", "--without-mingle", "--schedule",
                       str(self.var / "celerybeat-schedule")],
        }[name]

    def start(self, name: str) -> None:
        with self.lock:
            log = open(self.var / f"{name}.log", "ab")
            self.procs[name] = subprocess.Popen(self.argv(name), cwd=ROOT, env=self.env, stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)
            log.close()
            self.down.discard(name)

    def kill(self, name: str, at: float) -> None:
        """kill -9 the process group of ``name``; ``at``: seconds after the first submit, recorded."""
        with self.lock:
            self.down.add(name)
            proc = self.procs[name]
            self.killed.append(Killed(at, name))
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()

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


def until_answered(stop_at: float, fn, what: str):
    """Call ``fn`` until it answers (the web may be down or restarting): a connection error or a 5xx is retried."""
    last = None
    while time.monotonic() < stop_at:
        try:
            status, body = fn()
            if status < 500:
                return status, body
            last = f"HTTP {status}: {body[:200]!r}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.3)
    raise RuntimeError(f"{what}: no answer before the deadline ({last})")
