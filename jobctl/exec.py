"""``jobctl exec JOB [--rank N] [-i] [-t] -- CMD ARGS...`` and ``jobctl shell JOB``: a command inside a running
replica, over the WebSocket ``/ws/jobs/<id>/exec/`` (binary frames, a channel byte first: 0 stdin, 1 stdout,
2 stderr, 3 status, 4 resize). jobctl exits with the command's exit code; a refusal prints the server's message
(4 for a job that is not yours to see, 1 for one not Running)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import urllib.parse

from .exits import EXIT_API_ERROR, EXIT_NOT_FOUND, UsageError

STDIN, STDOUT, STDERR, STATUS, RESIZE = 0, 1, 2, 3, 4


def exec_url(server: str, job_id: int, command: list[str], *, rank: int, tty: bool, rows: int = 0,
             cols: int = 0) -> str:
    parts = urllib.parse.urlsplit(server)
    scheme = "wss" if parts.scheme == "https" else "ws"
    query = [("rank", str(rank)), *(("command", c) for c in command)]
    if tty:
        query += [("tty", "1"), ("rows", str(rows)), ("cols", str(cols))]
    return urllib.parse.urlunsplit((scheme, parts.netloc, f"{parts.path.rstrip('/')}/ws/jobs/{job_id}/exec/",
                                    urllib.parse.urlencode(query), ""))


def cmd_exec(api, args, out) -> int:
    command = list(args.argv)
    tty = bool(getattr(args, "tty", False))
    if not command and not tty:
        raise UsageError("exec needs a command after -- (or -it for a shell)")
    return run(api, args.id, command, rank=args.rank, tty=tty, interactive=bool(getattr(args, "stdin", False)))


def cmd_shell(api, args, out) -> int:
    return run(api, args.id, list(args.argv), rank=args.rank, tty=True, interactive=True)


def run(api, job_id: int, command: list[str], *, rank: int, tty: bool, interactive: bool) -> int:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    size = shutil.get_terminal_size()
    headers = {"Authorization": f"Token {api.token}"} if api.token else {}
    headers["Origin"] = api.server
    url = exec_url(api.server, job_id, command, rank=rank, tty=tty, rows=size.lines, cols=size.columns)
    try:
        ws = connect(url, additional_headers=headers, open_timeout=api.timeout, max_size=None)
    except (OSError, Exception) as exc:  # refused handshakes (websockets.InvalidStatus) included
        print(f"jobctl: cannot open a session into job {job_id} at {api.server}: {exc}", file=sys.stderr)
        return EXIT_API_ERROR
    status: dict = {}
    with ws, _raw(tty and sys.stdin.isatty()) as raw:
        if interactive or tty:
            threading.Thread(target=_pump_stdin, args=(ws, tty), daemon=True).start()
        else:
            ws.send(bytes([STDIN]))  # no input: the command reads an empty stdin
        if raw:
            _follow_size(ws)
        try:
            for frame in ws:
                if not isinstance(frame, bytes) or not frame:
                    continue
                channel, data = frame[0], frame[1:]
                if channel in (STDOUT, STDERR):
                    stream = sys.stdout.buffer if channel == STDOUT else sys.stderr.buffer
                    stream.write(data)
                    stream.flush()
                elif channel == STATUS:
                    status = json.loads(data)
        except ConnectionClosed:
            pass
    return _exit_code(status)


def _exit_code(status: dict) -> int:
    if status.get("status") == "Success":
        return 0
    if "exit_code" in status:
        return int(status["exit_code"])
    print(f"jobctl: {status.get('message') or 'the session ended without an exit code'}", file=sys.stderr)
    return EXIT_NOT_FOUND if status.get("code") == 404 else EXIT_API_ERROR


def _pump_stdin(ws, tty: bool) -> None:
    fd = sys.stdin.fileno()
    with contextlib.suppress(Exception):
        while data := os.read(fd, 65536):
            ws.send(bytes([STDIN]) + data)
        if not tty:
            ws.send(bytes([STDIN]))  # end of input


def _follow_size(ws) -> None:
    def resized(*_):
        size = shutil.get_terminal_size()
        with contextlib.suppress(Exception):
            ws.send(bytes([RESIZE]) + json.dumps({"Width": size.columns, "Height": size.lines}).encode())

    signal.signal(signal.SIGWINCH, resized)


@contextlib.contextmanager
def _raw(wanted: bool):
    """The local terminal in raw mode while a remote terminal runs (keys, Ctrl-C included, go to it)."""
    if not wanted:
        yield False
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
