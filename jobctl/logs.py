"""The command that prints a replica's log: `jobctl logs`, once or followed (-f) across attempts, or the first
rank that failed (--failed)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from .client import Api
from .exits import EXIT_NOT_FOUND, EXIT_OK
from .job_summary import job_path
from .output import Printer

LOG_CHUNK = 1 << 20


@dataclass
class _Failure:
    """What the logs endpoint says of an attempt (default: the current one) for ``jobctl logs -f --failed``."""

    attempt: int | None  # the attempt asked about (None: the job has no attempt yet)
    current: int | None
    rank: int | None  # its first failed rank (None: none failed so far)
    phase: str
    finished: bool

    @property
    def over(self) -> bool:
        """No replica of the attempt failed, and none will: another attempt followed it, or the job ended."""
        if self.attempt is None:
            return self.finished
        return self.finished or (self.current is not None and self.current != self.attempt)


def _failure(api: Api, job_id: int, attempt: int | None) -> _Failure:
    reply = api.request("GET", job_path(job_id, "logs"), params={"attempt": attempt, "tail_bytes": 0},
                        accept="application/json, text/plain")
    headers = {k.lower(): v for k, v in reply.headers.items()}

    def number(name: str) -> int | None:
        return int(headers[name]) if headers.get(name) else None

    return _Failure(number("x-log-attempt"), number("x-job-current-attempt"), number("x-log-failed-rank"),
                    headers.get("x-job-phase", "?"), headers.get("x-job-finished") == "true")


def cmd_logs(api: Api, args, out: Printer) -> int:
    stdout = sys.stdout.buffer
    path = job_path(args.id, "logs")

    def write(chunk: bytes) -> None:
        stdout.write(chunk)
        stdout.flush()

    if not args.follow:
        api.request("GET", path, params={"replica": args.rank, "failed": "true" if args.failed else None,
                                         "attempt": args.attempt, "tail_bytes": args.tail},
                    accept="application/json, text/plain", sink=write)
        return EXIT_OK

    attempt = args.attempt
    pinned = args.attempt is not None
    rank = None if args.failed else (args.rank or 0)  # with --failed: known once a replica of the attempt fails
    shown_failed = False
    offset: int | None = None
    waiting_said = False
    while True:
        if rank is None:
            failure = _failure(api, args.id, attempt)  # unpinned: always the current attempt
            if failure.rank is not None:
                attempt, rank, offset, shown_failed = failure.attempt, failure.rank, None, True
                print(f"--- attempt {attempt}: replica {rank} failed first ---", file=sys.stderr)
                continue
            if failure.over:
                if shown_failed:  # the attempt after a failed one ended without failing
                    return EXIT_OK
                print(f"No replica of attempt {failure.attempt} failed." if failure.attempt else
                      f"Job {args.id} ended before any attempt started: no replica failed.", file=sys.stderr)
                return EXIT_NOT_FOUND
            if not waiting_said:
                where = f"attempt {failure.attempt}, " if failure.attempt else ""
                print(f"waiting for a replica of job {args.id} to fail ({where}{failure.phase})...", file=sys.stderr)
                waiting_said = True
            time.sleep(args.interval)
            continue

        params: dict[str, Any] = {"replica": rank, "attempt": attempt}
        if offset is None and args.tail is not None:
            params["tail_bytes"] = args.tail
        else:
            params["start"] = offset or 0
            params["end"] = (offset or 0) + LOG_CHUNK
        reply = api.request("GET", path, params=params, accept="application/json, text/plain")
        headers = {k.lower(): v for k, v in reply.headers.items()}
        served = headers.get("x-log-attempt") or ""
        current = headers.get("x-job-current-attempt") or ""
        finished = headers.get("x-job-finished") == "true"
        if reply.body:
            write(reply.body)
        offset = int(headers.get("x-log-end") or 0)
        size = int(headers.get("x-log-size") or 0)
        if served and attempt is None:
            attempt = int(served)
        if offset < size:
            continue  # more is there already
        if not pinned and current and attempt is not None and int(current) != attempt:
            if args.failed:  # on to the next attempt's first failed rank, once one fails
                attempt, rank, waiting_said = None, None, False
            else:
                print(f"--- attempt {current} ---", file=sys.stderr)
                attempt, offset = int(current), 0
            continue
        if finished:
            return EXIT_OK
        if not served and not waiting_said:
            print(f"waiting for job {args.id} to start ({headers.get('x-job-phase', '?')})...", file=sys.stderr)
            waiting_said = True
        time.sleep(args.interval)
