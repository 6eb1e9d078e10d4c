"""Supervisor of one replica of the local backend. Standalone: no Django, run as a script.

    python local_runner.py STATE_DIR LOG_FILE WORK_DIR -- /bin/bash -c COMMAND

It detaches (fork, new session) so the replica outlives the web server that started it, then writes
into STATE_DIR: ``runner.pid`` ("pid starttime"), ``child.pid``, and at the end ``exit_code`` (atomically).
SIGTERM to the process group reaches the command; the runner itself outlives it to record the exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def proc_start_time(pid: int) -> str:
    """The kernel's start time of a process, to tell it from a later process that reuses the pid."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _default_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def supervise(state: Path, log: Path, cwd: Path, argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: None)  # the command gets it too; we stay to record its exit
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    write_atomic(state / "runner.pid", f"{os.getpid()} {proc_start_time(os.getpid())}")
    with open(log, "ab", buffering=0) as out, open(os.devnull, "rb") as devnull:
        try:
            child = subprocess.Popen(
                argv, cwd=cwd, stdin=devnull, stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=_default_signals,
            )
        except OSError as exc:
            out.write(f"jobsite: cannot start the command: {exc}\n".encode())
            write_atomic(state / "exit_code", "127")
            return 127
        write_atomic(state / "child.pid", str(child.pid))
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:
                continue
    # A command killed by signal N exits as 128+N, as a shell reports it.
    code = 128 - code if code < 0 else code
    write_atomic(state / "exit_code", str(code))
    return code


def main() -> None:
    state, log, cwd = (Path(a) for a in sys.argv[1:4])
    if sys.argv[4] != "--":
        raise SystemExit("usage: local_runner.py STATE LOG CWD -- ARGV...")
    argv = sys.argv[5:]
    if os.fork() > 0:
        os._exit(0)  # the launcher reaps this parent at once; the supervisor is adopted by init
    os.setsid()  # session and process group leader: killpg(pid) reaches the command and all it starts
    os.chdir("/")
    fd = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(fd, std)
    try:
        supervise(state, log, cwd, argv)
    finally:
        os._exit(0)


if __name__ == "__main__":
    main()
