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

# A line the Kubernetes backend writes into an archive where the cluster's log lost lines before they were read
# (rotated, or a container instance that ended unread), e.g. "[jobsite: log lines lost here: the cluster rotated
# the log before it was read]". The log viewer (static/js/logview/render.js) shows such lines apart.
LOST_LINES_PREFIX = "[jobsite: log lines lost here"


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


# --- following a log at any rate ----------------------------------------------------------------------------

# A reader more than this many bytes behind the end of a log gets only its last FOLLOW_TAIL_BYTES, and a note of
# the bytes skipped; it fetches them on demand by byte range. The tail is smaller than the window so that a reader
# that fell behind catches up with little work (a screenful or two of lines).
FOLLOW_WINDOW_BYTES = 256 * 1024
FOLLOW_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class FollowStep:
    data: bytes  # the bytes [start, start + len(data)) of the log
    start: int
    size: int | None  # of the file when read; None if there is no file (yet)
    skipped_from: int | None = None  # bytes [skipped_from, start) were left out: the reader was too far behind

    @property
    def end(self) -> int:
        return self.start + len(self.data)


def follow_step(path: Path, offset: int, *, window: int = FOLLOW_WINDOW_BYTES, tail: int = FOLLOW_TAIL_BYTES,
                whole_lines: bool = False) -> FollowStep:
    """What to send next to a reader that has the log up to ``offset``: everything after it, or, when that is more
    than ``window`` bytes, only the last ``tail`` bytes (from a line boundary) and where the skipped bytes are.
    With ``whole_lines``, a line still being written is left for later."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if offset >= size:
                return FollowStep(b"", offset, size)
            skipped_from, start = (None, offset) if size - offset <= window else (offset, size - min(tail, window))
            f.seek(start)
            data = f.read(size - start)
    except (FileNotFoundError, NotADirectoryError):
        return FollowStep(b"", offset, None)
    if skipped_from is not None:
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:  # start on a line of its own when there is one in the window
            data, start = data[newline + 1:], start + newline + 1
    if whole_lines and not data.endswith(b"\n"):
        data = data[:data.rfind(b"\n") + 1]
    return FollowStep(data, start, size, skipped_from=skipped_from)


# --- searching a whole log ----------------------------------------------------------------------------------

SEARCH_CHUNK_BYTES = 4 * 1024 * 1024
SEARCH_LINE_MAX_BYTES = 2000  # of a matching line, at most this much around the match is returned


@dataclass(frozen=True)
class LogMatch:
    offset: int  # byte offset of the match
    line_start: int  # byte offsets of its line (without the newline)
    line_end: int
    text: str  # the line, or SEARCH_LINE_MAX_BYTES of it around the match
    text_start: int  # byte offset of ``text`` in the log

    def as_dict(self) -> dict:
        return {"offset": self.offset, "line_start": self.line_start, "line_end": self.line_end,
                "text": self.text, "text_start": self.text_start}


def _matches_in(block: bytes, base: int, needle: bytes, *, case_sensitive: bool) -> list[LogMatch]:
    """Each line of ``block`` (complete lines, starting at byte ``base`` of the log) with ``needle``: its first
    match. ``needle`` is lower-cased already unless ``case_sensitive``."""
    haystack = block if case_sensitive else block.lower()  # ASCII only: byte offsets stay the same
    found: list[LogMatch] = []
    position = haystack.find(needle)
    while position >= 0:
        line_start = block.rfind(b"\n", 0, position) + 1
        line_end = block.find(b"\n", position)
        if line_end < 0:
            line_end = len(block)
        text_start = max(line_start, min(position - SEARCH_LINE_MAX_BYTES // 2, line_end - SEARCH_LINE_MAX_BYTES))
        text_end = min(line_end, text_start + SEARCH_LINE_MAX_BYTES)
        found.append(LogMatch(base + position, base + line_start, base + line_end,
                              block[text_start:text_end].decode("utf-8", errors="replace"), base + text_start))
        position = haystack.find(needle, line_end + 1)  # one match per line
    return found


def search_log(path: Path, query: str, *, after: int = 0, before: int | None = None, limit: int = 20,
               case_sensitive: bool = False) -> list[LogMatch] | None:
    """The first ``limit`` lines at or after byte ``after`` that contain ``query`` (or, with ``before``, the last
    ``limit`` lines whose match starts before it), in file order; None if there is no log.

    The file is read in chunks of SEARCH_CHUNK_BYTES cut at line ends, so memory stays bounded whatever its size
    (a line longer than a chunk is searched in pieces that overlap by the query's length).
    """
    needle = query.encode() if case_sensitive else query.encode().lower()
    if not needle:
        return []
    try:
        handle = path.open("rb")
    except (FileNotFoundError, NotADirectoryError):
        return None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if before is None:
            return _search_forward(handle, needle, min(after, size), size, limit, case_sensitive)
        return _search_backward(handle, needle, min(before, size), limit, case_sensitive)


def _search_forward(handle: BinaryIO, needle: bytes, after: int, size: int, limit: int,
                    case_sensitive: bool) -> list[LogMatch]:
    found: list[LogMatch] = []
    handle.seek(after)
    base, carry = after, b""  # the block read next starts at ``base`` with ``carry``, left from the one before
    while len(found) < limit and base < size:
        chunk = handle.read(min(SEARCH_CHUNK_BYTES, size - base - len(carry)))
        block = carry + chunk
        last = not chunk or base + len(block) >= size
        if last:
            cut = len(block)
        else:  # up to the last line end; in one very long line, all but what a match may still need
            cut = block.rfind(b"\n") + 1 or max(0, len(block) - len(needle) + 1)
        found.extend(m for m in _matches_in(block, base, needle, case_sensitive=case_sensitive)
                     if after <= m.offset < base + cut)
        if last:
            break
        base, carry = base + cut, block[cut:]
    return found[:limit]


def _search_backward(handle: BinaryIO, needle: bytes, before: int, limit: int,
                     case_sensitive: bool) -> list[LogMatch]:
    found: list[LogMatch] = []
    # A match starting just before ``before`` may end after it: take the bytes it needs (up to its line's end).
    handle.seek(before)
    tail = handle.read(len(needle) - 1)
    newline = tail.find(b"\n")
    carry = tail[:newline] if newline >= 0 else tail  # bytes from ``stop`` on, searched with the chunk before
    stop = high = before  # matches from ``high`` on have been taken
    while len(found) < limit and stop > 0:
        start = max(0, stop - SEARCH_CHUNK_BYTES)
        handle.seek(start)
        block = handle.read(stop - start) + carry
        cut, keep = 0, 0
        if start > 0:  # the first line may begin in the chunk before: leave it for then
            cut = block.find(b"\n") + 1
            keep = cut
            if not cut:  # one very long line: keep what a match starting in the first bytes needs
                cut = min(len(block), len(needle) - 1)
                keep = min(len(block), cut + len(needle) - 1)
        found[:0] = [m for m in _matches_in(block, start, needle, case_sensitive=case_sensitive)
                     if start + cut <= m.offset < high]
        stop, high, carry = start, start + cut, block[:keep]
    return found[-limit:]
