"""Reading replica logs, for the pages and the API alike. Logs are files the backend keeps (local: written by
the replica; Kubernetes: archived from the pod log API), so reading never needs the cluster."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest

from .models import Attempt

CHUNK_BYTES = 64 * 1024


def log_root(backend: str) -> Path | None:
    """Where the backend called ``backend`` keeps replica logs; None if it is unknown here.

    The local backend writes them under its own root; the Kubernetes backend archives them under JOBSITE_LOG_ROOT
    (a volume the scheduler writes and the web processes read).
    """
    if backend == "local":
        return Path(settings.JOBSITE_LOCAL_ROOT) / "logs"
    if backend == "kubernetes":
        return Path(settings.JOBSITE_LOG_ROOT)
    return None


def replica_log_path(root: Path, job_id: int, attempt_number: int, rank: int) -> Path:
    return root / f"job-{job_id}" / f"attempt-{attempt_number}" / f"replica-{rank}.log"


def log_path(attempt: Attempt, rank: int) -> Path | None:
    """Where the log of replica ``rank`` of ``attempt`` is kept; None if its backend is unknown here."""
    root = log_root(attempt.backend)
    return None if root is None else replica_log_path(root, attempt.job_id, attempt.number, rank)


@dataclass(frozen=True)
class LogWindow:
    text: str
    start: int  # byte offsets of the text in the file
    end: int
    size: int  # of the whole file when read


def read_window(path: Path | None, *, max_bytes: int, end: int | None = None) -> LogWindow | None:
    """At most ``max_bytes`` of a log ending at ``end`` (default: its end), starting at a line boundary; None if
    there is no log. Only that much is read, so a 50 MB log opens as fast as a small one."""
    if path is None:
        return None
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            stop = size if end is None else max(0, min(end, size))
            start = max(stop - max_bytes, 0)
            f.seek(start)
            data = f.read(stop - start)
    except (FileNotFoundError, NotADirectoryError):
        return None
    stop = start + len(data)
    if start:  # not in the middle of a line (or of a UTF-8 character)
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:
            data = data[newline + 1:]
            start += newline + 1
    return LogWindow(data.decode("utf-8", errors="replace"), start, stop, size)


class FileSlice:
    """Bytes [start, end) of an open log, end being its size when opened (it may grow while it is sent).

    An iterable for a streaming response; closes the file when the response is closed.
    """

    def __init__(self, handle: BinaryIO, *, start: int | None = None, end: int | None = None,
                 tail_bytes: int | None = None):
        self.handle = handle
        try:
            size = os.fstat(handle.fileno()).st_size
        except OSError:
            handle.close()
            raise
        self.size = size
        stop = size if end is None else min(end, size)
        begin = max(0, stop - tail_bytes) if tail_bytes is not None else (start or 0)
        self.start = min(begin, stop)
        self.remaining = stop - self.start
        handle.seek(self.start)

    def __iter__(self) -> Iterator[bytes]:
        while self.remaining > 0:
            chunk = self.handle.read(min(CHUNK_BYTES, self.remaining))
            if not chunk:
                break
            self.remaining -= len(chunk)
            yield chunk

    def close(self) -> None:
        self.handle.close()

    async def _chunks(self):
        try:
            while self.remaining > 0:
                chunk = await asyncio.to_thread(self.handle.read, min(CHUNK_BYTES, self.remaining))
                if not chunk:
                    break
                self.remaining -= len(chunk)
                yield chunk
        finally:
            self.handle.close()

    def body_for(self, request: HttpRequest) -> Iterable[bytes] | AsyncIterator[bytes]:
        """What a StreamingHttpResponse should send: under ASGI an async iterator (Django would otherwise read a
        sync iterator whole into memory first), under WSGI the slice itself."""
        if isinstance(getattr(request, "_request", request), ASGIRequest):
            return self._chunks()
        return self


def open_slice(path: Path | None, **kw: int | None) -> FileSlice | None:
    """A FileSlice of the log at ``path``, or None if there is no log yet."""
    if path is None:
        return None
    try:
        handle = open(path, "rb")
    except (FileNotFoundError, NotADirectoryError):
        return None
    return FileSlice(handle, **kw)
