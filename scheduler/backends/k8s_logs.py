"""Pod logs archived incrementally: each fetch asks the pod log API only for what is new, in a thread pool.

``LogArchiver.follow`` (every sync round, for each running replica) returns at once; at most once per
``refresh_seconds`` per pod a worker asks the log API for ``timestamps=true&sinceTime=<the last archived line's
second>&limitBytes=<bound>`` and appends the lines not archived yet to the replica's log file. ``finish`` does
the same in the calling thread, until nothing is left (before a pod is deleted, once its container ended).

How a fetch knows what is new:
- Each line of the answer starts with its timestamp (RFC3339, nanoseconds). The cursor is the timestamp of the
  last archived line and how many lines with exactly that timestamp were archived. The API takes ``sinceTime`` to
  the second only, so the answer starts at the cursor's second: lines older than the cursor are dropped, of the
  lines at the cursor the first ``count`` are skipped, the rest is appended with the timestamps taken off.
  A request costs the new bytes plus those of the cursor's second, whatever the size of the log.
- ``limitBytes`` bounds an answer; one that reaches it may end in a cut line, which is dropped (fetched again
  next time) and the pod is due again at once. Should a whole answer hold no new whole line (a line longer than
  the bound, or more than the bound in the cursor's second) the bound grows fourfold up to ``max_limit_bytes``;
  past that, the rest of that second is skipped (the API cannot start within a second), a marker line written
  in its place, and a warning logged.
- The cursor is kept in memory and, after every append, in ``<log>.offset`` (JSON, replaced atomically) with the
  archive's size: a new archiver (a restart, another leader) goes on from there. Archive bytes past the recorded
  size (appended just before a crash, before their cursor was saved) are cut off and fetched again. An archive
  without cursor file (written by the former full-copy archiver) is adopted once: the whole log is read and the
  archive matched against it (by size, else by its last line); only what follows is appended.
- A last line without "\\n": the kubelet gives whole lines, each ended by "\\n", but for a line the runtime has
  not finished (a partial entry: a line over 16 KiB, output without newlines) or caught mid-write. Such a line
  grows at its own timestamp, so ``follow`` leaves it for a later fetch; ``finish`` (the container ended or the
  pod goes) takes it as complete, and a later line then starts on a line of its own in the archive.
- A container restarted in place keeps its log's timestamps increasing, so the current log simply goes on. With
  ``restarts`` (the container's restartCount) given, a fetch that sees it grow first reads what is left of the
  previous instance (``previous=true``), then the current one.
- Timestamps must not go back (a node clock stepped back): lines older than the cursor are dropped.

Errors: 400 (container not started, no previous instance) and 404 (pod gone) mean nothing to read. 429 waits
for its Retry-After, 5xx, other 4xx and network errors for a per-pod backoff; ``follow`` never waits, it only
skips a pod until its time has come.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .k8s_api import log_api_client
from .k8s_log_lines import NS, format_timestamp, parse_timestamp, timestamped_lines

log = logging.getLogger(__name__)

LIMIT_BYTES = 4 << 20  # per request
MAX_LIMIT_BYTES = 64 << 20  # grown to when the cursor's second alone fills a request
FINISH_ROUNDS = 64  # requests of one ``finish`` at most
MAX_RETRY_AFTER = 600.0
STATE_SUFFIX = ".offset"
LOG_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/log"

def state_path(path: Path) -> Path:
    """Where the cursor of the archive ``path`` is kept."""
    return path.with_name(path.name + STATE_SUFFIX)


@dataclass
class LogStats:
    bytes_received: int = 0  # bodies of the log API's answers
    requests: int = 0
    errors: int = 0  # failed requests (not 400/404)


@dataclass
class _Result:
    ok: bool  # the API answered, or there was nothing to read
    more: bool = False  # an answer reached its byte bound: more is waiting
    retry_after: float | None = None


@dataclass(eq=False)
class _Pod:
    name: str
    path: Path
    limit: int
    io: threading.Lock = field(default_factory=threading.Lock)
    # Under ``io`` (one fetch of a pod at a time): the cursor and the archive.
    loaded: bool = False
    adopt: bool = False  # an archive without cursor: find where it ends in the log first
    last_ns: int | None = None  # timestamp of the last archived line
    count: int = 0  # lines archived with exactly that timestamp
    open_line: bool = False  # the archive ends without "\n"
    size: int = 0
    restarts: int | None = None  # the restart count up to which previous instances are archived
    # Under the archiver's lock.
    seen_restarts: int | None = None
    busy: int = 0  # fetches queued or running
    due: float = 0.0  # monotonic: next refresh
    not_before: float = 0.0  # monotonic: end of a backoff
    failures: int = 0
    more: bool = False
    retired: bool = False  # forgotten while busy: dropped once idle


class LogArchiver:
    """Keeps the log files of pods' ``container`` current from the pod log API, incrementally (module docstring).

    ``workers=0`` runs ``follow``'s fetches in the caller's thread (tests, debugging).
    """

    def __init__(
        self,
        *,
        core: client.CoreV1Api,
        namespace: str,
        container: str,
        workers: int = 8,
        refresh_seconds: float = 5.0,
        request_timeout: float | tuple[float, float] = (10, 60),
        limit_bytes: int = LIMIT_BYTES,
        max_limit_bytes: int = MAX_LIMIT_BYTES,
        backoff_seconds: float = 1.0,
        max_backoff_seconds: float = 60.0,
    ):
        self.core = core
        self.namespace = namespace
        self.container = container
        self.workers = workers
        self.refresh_seconds = refresh_seconds
        self.request_timeout = request_timeout
        self.limit_bytes = limit_bytes
        self.max_limit_bytes = max(max_limit_bytes, limit_bytes)
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.stats = LogStats()
        self._lock = threading.Condition()
        self._pods: dict[str, _Pod] = {}
        self._busy = 0
        self._closed = False
        self._api = log_api_client(core.api_client)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pod-logs") if workers else None

    # --- the interface ------------------------------------------------------------------------------------

    def follow(self, pod_name: str, path: Path | str, *, restarts: int | None = None) -> None:
        """Have the pod's new lines appended to ``path`` soon; returns at once. Call it as often as you like."""
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return
            st = self._state(pod_name, Path(path), restarts)
            if st is None or st.busy or now < st.not_before or (now < st.due and not st.more):
                return
            st.busy += 1
            self._busy += 1
            st.due = now + self.refresh_seconds
        if self._pool is None:
            self._work(st)
            return
        try:
            self._pool.submit(self._work, st)
        except RuntimeError:  # closed meanwhile
            self._settle(st, _Result(ok=True))

    def finish(self, pod_name: str, path: Path | str, *, restarts: int | None = None) -> bool:
        """Append all that is left now, in this thread (waits for a fetch of the pod under way).

        True when the archive is complete (or there is nothing to read: container not started, pod gone); False
        when the API failed (or more than ``FINISH_ROUNDS`` bounded requests were not enough).
        """
        path = Path(path)
        with self._lock:
            st = self._state(pod_name, path, restarts)
            if st is None:  # a fetch for another path of the same pod is under way: use a state of its own
                st = _Pod(pod_name, path, self.limit_bytes, seen_restarts=restarts)
            st.busy += 1
            self._busy += 1
            st.due = time.monotonic() + self.refresh_seconds
        result = _Result(ok=False)
        try:
            with st.io:
                result = self._copy(st, rounds=FINISH_ROUNDS, final=True)
        except Exception:
            log.exception("archiving the log of pod %s failed", pod_name)
        finally:
            self._settle(st, result)
        return result.ok and not result.more

    def forget(self, pod_name: str) -> None:
        """Drop what is kept in memory about the pod (its archive and cursor file stay)."""
        with self._lock:
            st = self._pods.get(pod_name)
            if st is None:
                return
            if st.busy:
                st.retired = True
            else:
                del self._pods[pod_name]

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no fetch is queued or running; False if ``timeout`` passed first."""
        with self._lock:
            return self._lock.wait_for(lambda: self._busy == 0, timeout)

    def close(self, *, wait: bool = False) -> None:
        """Stop the pool: queued fetches are dropped, running ones end on their own (``wait``: wait for them)."""
        with self._lock:
            self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
        if wait or self._pool is None:
            self._api.close()

    # --- scheduling (under self._lock) -----------------------------------------------------------------------

    def _state(self, name: str, path: Path, restarts: int | None) -> _Pod | None:
        st = self._pods.get(name)
        if st is not None and st.path != path:
            if st.busy:
                return None
            st = None
        if st is None:
            st = self._pods[name] = _Pod(name, path, self.limit_bytes)
        st.retired = False
        if restarts is not None:
            st.seen_restarts = max(restarts, st.seen_restarts or 0)
        return st

    def _work(self, st: _Pod) -> None:
        result = _Result(ok=False)
        try:
            with st.io:
                result = self._copy(st, rounds=1, final=False)
        except Exception:  # the archive could not be written (disk full, ...): like a failed request
            log.exception("archiving the log of pod %s failed", st.name)
        finally:
            self._settle(st, result)

    def _settle(self, st: _Pod, result: _Result) -> None:
        now = time.monotonic()
        with self._lock:
            st.busy -= 1
            self._busy -= 1
            if result.ok:
                st.failures = 0
                st.not_before = 0.0
                st.more = result.more
            else:
                st.failures += 1
                delay = result.retry_after
                if delay is None:
                    delay = min(self.backoff_seconds * 2 ** min(st.failures - 1, 30), self.max_backoff_seconds)
                st.not_before = now + delay
            if st.retired and not st.busy and self._pods.get(st.name) is st:
                del self._pods[st.name]
            self._lock.notify_all()

    # --- fetching (under st.io) ----------------------------------------------------------------------------

    def _copy(self, st: _Pod, *, rounds: int, final: bool) -> _Result:
        if not st.loaded:
            self._load(st)
        with self._lock:
            seen = st.seen_restarts
        if seen is not None:
            if st.restarts is None:  # nothing known of earlier instances: from now on
                st.restarts = seen
            elif seen > st.restarts:
                result = self._rounds(st, rounds, previous=True, final=True)
                if not result.ok or result.more:
                    return result
                st.restarts = seen
                self._save(st)
        return self._rounds(st, rounds, previous=False, final=final)

    def _rounds(self, st: _Pod, rounds: int, *, previous: bool, final: bool) -> _Result:
        result = _Result(ok=True)
        for _ in range(rounds):
            result = self._fetch(st, previous=previous, final=final)
            if not result.ok or not result.more:
                break
        return result

    def _fetch(self, st: _Pod, *, previous: bool, final: bool) -> _Result:
        adopt = st.adopt and not previous
        limit = None if adopt else st.limit
        try:
            data = self._request(st.name, since_ns=None if adopt else st.last_ns, limit=limit, previous=previous)
        except ApiException as exc:
            if exc.status in (400, 404):  # not started yet / no previous instance; the pod is gone
                return _Result(ok=True)
            return self._failed(st, exc)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return self._failed(st, exc)
        truncated = limit is not None and len(data) >= limit
        lines = timestamped_lines(data, truncated=truncated, unended=final, default_ns=st.last_ns)
        if adopt:
            self._adopt(st, lines)
        written = self._append(st, lines)
        if not truncated:
            st.limit = self.limit_bytes
            return _Result(ok=True)
        if not written:  # archived lines and at most one cut line filled the answer
            if st.limit < self.max_limit_bytes:
                st.limit = min(st.limit * 4, self.max_limit_bytes)
            else:
                self._skip(st, data)
        return _Result(ok=True, more=True)

    def _skip(self, st: _Pod, data: bytes) -> None:
        """Get past an answer of ``max_limit_bytes`` without a new whole line, at the cost of the rest of a second:
        that of its cut line (a line over the bound), else the cursor's (over the bound within one second)."""
        cut = data[data.rfind(b"\n") + 1:]
        space = cut.find(b" ")
        stuck = parse_timestamp(cut[:space]) if space > 0 else None
        if stuck is None or (st.last_ns is not None and stuck < st.last_ns):
            stuck = st.last_ns
        if stuck is None:
            return
        second = format_timestamp(stuck, fraction=False)
        log.warning("pod %s wrote over %d bytes without a line end, or within %s: the rest of that second is "
                    "not archived", st.name, st.limit, second)
        marker = f"[jobsite: log output left out: over {st.limit} bytes at {second}]\n".encode()
        self._write(st, [b"\n", marker] if st.open_line else [marker], (stuck // NS + 1) * NS, 0, False)

    def _request(self, name: str, *, since_ns: int | None, limit: int | None, previous: bool) -> bytes:
        # The generated read_namespaced_pod_log has no sinceTime: the same request, built by hand.
        query: list[tuple[str, str]] = [("container", self.container), ("timestamps", "true")]
        if since_ns is not None:
            query.append(("sinceTime", format_timestamp(since_ns // NS * NS, fraction=False)))
        if limit is not None:
            query.append(("limitBytes", str(limit)))
        if previous:
            query.append(("previous", "true"))
        api = self._api
        request = api.param_serialize(
            method="GET", resource_path=LOG_PATH, path_params={"namespace": self.namespace, "name": name},
            query_params=query, header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"],
        )
        with self._lock:
            self.stats.requests += 1
        response = api.call_api(*request, _request_timeout=self.request_timeout)
        data = response.read() or b""
        with self._lock:
            self.stats.bytes_received += len(data)
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return data

    def _failed(self, st: _Pod, exc: BaseException) -> _Result:
        with self._lock:
            self.stats.errors += 1
            first = st.failures == 0
        retry_after = _retry_after(exc)
        (log.warning if first else log.debug)("reading the log of pod %s failed: %s", st.name, _describe(exc))
        return _Result(ok=False, retry_after=retry_after)

    # --- the archive (under st.io) -------------------------------------------------------------------------

    def _append(self, st: _Pod, lines: list[tuple[int, bytes]]) -> int:
        """Append the lines after the cursor; returns how many."""
        last, count, skip, open_line = st.last_ns, st.count, st.count, st.open_line
        chunks: list[bytes] = []
        written = 0
        for ts, content in lines:
            if last is not None and ts < last:
                continue
            if ts == last:
                if skip:
                    skip -= 1
                    continue
                count += 1
            else:
                last, count, skip = ts, 1, 0
            if open_line:
                chunks.append(b"\n")
            chunks.append(content)
            open_line = not content.endswith(b"\n")
            written += 1
        if written:
            self._write(st, chunks, last, count, open_line)
        return written

    def _write(self, st: _Pod, chunks: list[bytes], last: int | None, count: int, open_line: bool) -> None:
        st.path.parent.mkdir(parents=True, exist_ok=True)
        with open(st.path, "ab") as f:
            f.write(b"".join(chunks))
            st.size = f.tell()
        st.last_ns, st.count, st.open_line = last, count, open_line
        self._save(st)

    def _save(self, st: _Pod) -> None:
        state = {"time": format_timestamp(st.last_ns) if st.last_ns is not None else None, "ns": st.last_ns,
                 "count": st.count, "open": st.open_line, "size": st.size, "restarts": st.restarts}
        target = state_path(st.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, target)

    def _load(self, st: _Pod) -> None:
        st.loaded = True
        try:
            state = json.loads(state_path(st.path).read_text())
            if not isinstance(state, dict):
                raise ValueError("not an object")
        except FileNotFoundError:
            state = None
        except (OSError, ValueError) as exc:
            log.warning("ignoring the log cursor of %s: %s", st.path, exc)
            state = None
        try:
            size = st.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if not size:  # a new archive (or one removed): from the start of the log, previous instances too
            st.last_ns, st.count, st.open_line, st.size, st.restarts = None, 0, False, 0, 0
            return
        if state is None:
            st.adopt, st.size = True, size
            return
        try:
            st.last_ns = None if state.get("ns") is None else int(state["ns"])
            st.count = int(state.get("count") or 0)
            st.open_line = bool(state.get("open"))
            recorded = int(state.get("size", size))
            st.restarts = None if state.get("restarts") is None else int(state["restarts"])
        except (TypeError, ValueError) as exc:
            log.warning("ignoring the log cursor of %s: %s", st.path, exc)
            st.last_ns, st.count, st.open_line, st.restarts = None, 0, False, None
            st.adopt, st.size = True, size
            return
        if size > recorded:  # appended before a crash, before its cursor was saved: fetched again
            log.info("cutting %s back to %d bytes, as its cursor says", st.path, recorded)
            os.truncate(st.path, recorded)
            size = recorded
        st.size = size

    def _adopt(self, st: _Pod, lines: list[tuple[int, bytes]]) -> None:
        """Set the cursor of an archive that has none at its last line in ``lines`` (the whole log)."""
        st.adopt = False
        with open(st.path, "rb") as f:
            f.seek(max(0, st.size - (1 << 16)))
            tail = f.read()
        st.open_line = bool(tail) and not tail.endswith(b"\n")
        end = None
        total = 0
        for i, (_ts, content) in enumerate(lines):
            total += len(content)
            if total >= st.size:
                if total == st.size and tail.endswith(content):
                    end = i
                break
        if end is None:  # not a prefix of the log (rotated since?): after the first line like the archive's last
            body = tail[:-1] if tail.endswith(b"\n") else tail
            last_line = tail[len(body) - len(body.split(b"\n")[-1]):]
            end = next((i for i, (_ts, content) in enumerate(lines) if content == last_line), None)
        if end is None:
            if lines:
                log.warning("the log archive %s does not match the log of pod %s: appending the whole log",
                            st.path, st.name)
            st.last_ns, st.count = None, 0
            return
        st.last_ns = lines[end][0]
        st.count = sum(1 for ts, _content in lines[: end + 1] if ts == st.last_ns)
        self._save(st)


def _retry_after(exc: BaseException) -> float | None:
    headers = getattr(exc, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    return f"{type(exc).__name__}: {exc}"
