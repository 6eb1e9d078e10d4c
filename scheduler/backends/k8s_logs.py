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

Load on the API: a pod due for a refresh waits in line for ``requests_per_second`` (k8s_log_pacing: spaced
evenly, no burst, shared by all pods; rank 0 and pods that wrote lines in the last ``HOT_SECONDS`` first, each
class round-robin), so that log polling never crowds out the scheduler's own requests. ``finish`` never waits:
its requests count against the budget of the polling that follows.

Lost lines: the kubelet serves only the current log file (rotated at containerLogMaxSize); a pod that writes
faster than it is polled loses the rotated part. An answer served from the cursor's second starts with the
cursor's line while that is still served. One that starts later means lines were rotated away unread, when the
cursor is a line of the log read now (``at_cursor``) and the restart count is known (a new instance is no gap):
a marker line (``LOST_ROTATED``) then goes before the lines appended. So does one (``LOST_RESTARTS``) when the
restart count grew by more than one between reads (the kubelet keeps the previous instance's log only). Both
are counted in ``stats.gaps``.

Errors: 400 (container not started, no previous instance) and 404 (pod gone) mean nothing to read. 429 waits
for its Retry-After, 5xx, other 4xx and network errors for a per-pod backoff; ``follow`` never waits, it only
skips a pod until its time has come.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .k8s_api import log_api_client
from .k8s_log_cursor import adopt_cursor, load_cursor, save_cursor, state_path
from .k8s_log_lines import NS, format_timestamp, parse_timestamp, timestamped_lines
from .k8s_log_pacing import PodQueue, RequestBudget, describe, retry_after

__all__ = ["LogArchiver", "LogStats", "state_path"]

log = logging.getLogger(__name__)

LIMIT_BYTES = 4 << 20  # per request
MAX_LIMIT_BYTES = 64 << 20  # grown to when the cursor's second alone fills a request
FINISH_ROUNDS = 64  # requests of one ``finish`` at most
HOT_SECONDS = 60.0  # a pod that wrote lines this recently is polled before the others
LOG_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/log"
# Written into an archive where lines were lost; jobs/logs.py knows the prefix, the log viewer shows such lines apart.
LOST_ROTATED = b"[jobsite: log lines lost here: the cluster rotated the log before it was read]\n"
LOST_RESTARTS = "[jobsite: log lines lost here: the container restarted {} times before its log was read]\n"

@dataclass
class LogStats:
    bytes_received: int = 0  # bodies of the log API's answers
    requests: int = 0
    errors: int = 0  # failed requests (not 400/404)
    gaps: int = 0  # lost-lines markers written
    waiting: int = 0  # pods due but waiting for the request budget, at the last pump


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
    at_cursor: bool = False  # the cursor is a line of the log read now: a log served without it lost lines
    paid: bool = False  # the next request's budget slot is taken already
    # Under the archiver's lock.
    seen_restarts: int | None = None
    busy: int = 0  # fetches queued or running
    due: float = 0.0  # monotonic: next refresh
    not_before: float = 0.0  # monotonic: end of a backoff
    failures: int = 0
    more: bool = False
    prefer: bool = False  # polled before the others (rank 0)
    wrote_at: float = float("-inf")  # clock: the last fetch that appended lines
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
        requests_per_second: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
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
        self.clock = clock
        self.budget = RequestBudget(requests_per_second, clock)
        self._queue = PodQueue()
        self._lock = threading.Condition()
        self._pods: dict[str, _Pod] = {}
        self._busy = 0
        self._closed = False
        self._api = log_api_client(core.api_client)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pod-logs") if workers else None
        self._pacer: threading.Thread | None = None
        if self._pool is not None and self.budget.bounded:
            self._pacer = threading.Thread(target=self._pace, name="pod-logs-pacer", daemon=True)
            self._pacer.start()

    # --- the interface ------------------------------------------------------------------------------------

    def follow(self, pod_name: str, path: Path | str, *, restarts: int | None = None, prefer: bool = False) -> None:
        """Have the pod's new lines appended to ``path`` soon; returns at once. Call it as often as you like.

        A pod due for a refresh waits in line for the request budget; ``prefer`` (rank 0) and pods that wrote
        lines recently go first."""
        now = self.clock()
        with self._lock:
            if self._closed:
                return
            st = self._state(pod_name, Path(path), restarts)
            if st is None:
                return
            st.prefer = prefer
            if not (st.busy or st in self._queue or now < st.not_before or (now < st.due and not st.more)):
                if not len(self._queue):
                    self._lock.notify_all()  # the pacer sleeps until a pod waits
                self._queue.push(st, hot=prefer or now - st.wrote_at < HOT_SECONDS)
        self.pump()

    def pump(self) -> int:
        """Start the fetches of the waiting pods that the request budget allows now; returns how many."""
        with self._lock:
            ready = self._take_ready()
        for st in ready:
            self._start(st)
        return len(ready)

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
            st.due = self.clock() + self.refresh_seconds
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
            self._queue.discard(st)
            if st.busy:
                st.retired = True
            else:
                del self._pods[pod_name]

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no fetch is queued or running; False if ``timeout`` passed first. (Pods waiting for the budget
        count only when the pacer thread starts them; without workers, ``pump`` does.)"""
        with self._lock:
            return self._lock.wait_for(lambda: self._busy == 0 and not (self._pacer and len(self._queue)), timeout)

    def close(self, *, wait: bool = False) -> None:
        """Stop the pool: queued fetches are dropped, running ones end on their own (``wait``: wait for them)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
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
            self._queue.discard(st)
            st = None
        if st is None:
            st = self._pods[name] = _Pod(name, path, self.limit_bytes)
        st.retired = False
        if restarts is not None:
            st.seen_restarts = max(restarts, st.seen_restarts or 0)
        return st

    def _take_ready(self) -> list[_Pod]:
        ready = []
        now = self.clock()
        while len(self._queue) and not self._closed and self.budget.try_take():
            st = self._queue.pop()
            st.paid = True
            st.busy += 1
            self._busy += 1
            st.due = now + self.refresh_seconds
            ready.append(st)
        self.stats.waiting = len(self._queue)
        return ready

    def _start(self, st: _Pod) -> None:
        if self._pool is None:
            self._work(st)
            return
        try:
            self._pool.submit(self._work, st)
        except RuntimeError:  # closed meanwhile
            self._settle(st, _Result(ok=True))

    def _pace(self) -> None:
        """Start waiting pods as the budget frees slots (follow and pump start those it allows at once)."""
        while True:
            with self._lock:
                while not self._closed and not (len(self._queue) and self.budget.wait_seconds() <= 0):
                    self._lock.wait(self.budget.wait_seconds() if len(self._queue) else None)
                if self._closed:
                    return
            self.pump()

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
        now = self.clock()
        with self._lock:
            st.busy -= 1
            self._busy -= 1
            st.paid = False
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
            load_cursor(st)
        with self._lock:
            seen = st.seen_restarts
        if seen is not None:
            if st.restarts is None:  # nothing known of earlier instances: from now on
                st.restarts = seen
            elif seen > st.restarts:
                if seen > st.restarts + 1 and st.at_cursor:  # whole instances ended unread
                    self._gap(st, LOST_RESTARTS.format(seen - st.restarts).encode())
                result = self._rounds(st, rounds, previous=True, final=True)
                if not result.ok or result.more:
                    return result
                st.restarts, st.at_cursor = seen, False  # the current instance's log starts after the cursor
                save_cursor(st)
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
            data = self._request(st, since_ns=None if adopt else st.last_ns, limit=limit, previous=previous)
        except ApiException as exc:
            if exc.status in (400, 404):  # not started yet / no previous instance; the pod is gone
                return _Result(ok=True)
            return self._failed(st, exc)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return self._failed(st, exc)
        truncated = limit is not None and len(data) >= limit
        lines = timestamped_lines(data, truncated=truncated, unended=final, default_ns=st.last_ns)
        if adopt:
            adopt_cursor(st, lines)
        # Served from the cursor's second on, the answer starts with the cursor's line; a later one: it was rotated
        # away (the kubelet serves the current file only), and maybe lines after it. Only with the restart count
        # known: without, a new container instance would look the same.
        with self._lock:
            counted = st.seen_restarts is not None
        lost = (not adopt and counted and st.at_cursor and st.last_ns is not None and bool(lines)
                and lines[0][0] > st.last_ns)
        written = self._append(st, lines, lost=lost)
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
        self._write(st, [b"\n", marker] if st.open_line else [marker], (stuck // NS + 1) * NS, 0, False, False)

    def _gap(self, st: _Pod, marker: bytes) -> None:
        """Write a lost-lines marker (the cursor stays, but lines after it are expected: no second marker)."""
        log.warning("pod %s: %s", st.name, marker.decode().strip())
        with self._lock:
            self.stats.gaps += 1
        self._write(st, [b"\n", marker] if st.open_line else [marker], st.last_ns, st.count, False, False)

    def _request(self, st: _Pod, *, since_ns: int | None, limit: int | None, previous: bool) -> bytes:
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
            method="GET", resource_path=LOG_PATH, path_params={"namespace": self.namespace, "name": st.name},
            query_params=query, header_params={"Accept": "text/plain"}, auth_settings=["BearerToken"],
        )
        with self._lock:
            self.stats.requests += 1
            if not st.paid:  # a second request of a fetch, or one of finish: it may not wait, the next ones do
                self.budget.force()
            st.paid = False
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
        (log.warning if first else log.debug)("reading the log of pod %s failed: %s", st.name, describe(exc))
        return _Result(ok=False, retry_after=retry_after(exc))

    # --- the archive (under st.io) -------------------------------------------------------------------------

    def _append(self, st: _Pod, lines: list[tuple[int, bytes]], *, lost: bool = False) -> int:
        """Append the lines after the cursor (after a lost-lines marker with ``lost``); returns how many."""
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
            if lost:
                log.warning("pod %s: the log was rotated before it was read: lines lost", st.name)
                with self._lock:
                    self.stats.gaps += 1
                chunks[:1 if st.open_line else 0] = [b"\n", LOST_ROTATED] if st.open_line else [LOST_ROTATED]
            self._write(st, chunks, last, count, open_line, True)
            with self._lock:
                st.wrote_at = self.clock()
        return written

    def _write(self, st: _Pod, chunks: list[bytes], last: int | None, count: int, open_line: bool,
               at_cursor: bool) -> None:
        st.path.parent.mkdir(parents=True, exist_ok=True)
        with open(st.path, "ab") as f:
            f.write(b"".join(chunks))
            st.size = f.tell()
        st.last_ns, st.count, st.open_line, st.at_cursor = last, count, open_line, at_cursor
        save_cursor(st)
