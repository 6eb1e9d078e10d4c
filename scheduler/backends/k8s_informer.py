"""A small informer: list, then watch, a namespaced resource in a background thread into an in-memory cache.

It keeps ``{name: object}`` (the API's JSON) current the way client-go's reflector does:

- **List, then watch.** A full LIST (paged) fills the cache and gives a resourceVersion; the watch starts from
  it (``allowWatchBookmarks``) and every event moves it on: ADDED/MODIFIED/DELETED change the cache, a BOOKMARK
  only moves the resourceVersion. When the server ends a watch (its ``timeoutSeconds``, or our read timeout on a
  silent stream) the next one resumes from the last resourceVersion: no LIST.
- **Expired (410 Gone).** An expired resourceVersion is reported either as an HTTP 410 answer to the watch (or
  list) request or, mid-stream, as an ``ERROR`` event carrying a ``Status`` with code 410 (what a real API server
  sends after a compaction). Both mean the same: forget the resourceVersion and relist. The watch stream is read
  here, not through ``kubernetes.watch.Watch``, which with ``deserialize=False`` fails on ERROR events.
- **Errors.** Other ERROR events and HTTP errors, network failures and a watch that ends at once with nothing in
  it are errors: the watch resumes from where it was after a backoff, or the informer relists when the answer
  says the request itself is unusable (4xx other than 429). Consecutive failures back off exponentially with
  jitter, ``min(retry_cap, retry_base * 2**(n-1)) * uniform(0.5, 1)`` for the n-th failure in a row, so the
  first relist after a single 410 is prompt and a server that keeps failing is not hammered. The count resets
  when a watch delivers an event or runs its course.
- **Resync without LIST.** Every ``resync_seconds`` the cache is handed to ``on_resync(items)`` (client-go's
  resync: a handler hook to re-check state), from a second thread; it does not touch the API. A full relist
  happens only at start, after the errors above, or on ``request_relist()``; ``on_relist()`` is called after
  every full list. The two hooks never run at the same time.

It does not rely on the server for what it can check itself: objects are filtered by ``accept`` on the client too
(an emulator or an old server may ignore selectors), a missing resourceVersion just means the next watch starts
from "now", and the watch is bounded by a client read timeout as well as the server timeout. ``stop()`` ends it
at once, also in the middle of a backoff.

For metrics: ``relists``, ``watches``, ``errors``, ``expired`` (410s seen; not counted in ``errors``),
``resyncs``, ``last_activity`` (monotonic time of the last successful list, event or bookmark) and
``lag_seconds()``.
"""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

Obj = dict[str, Any]

GONE = 410
SHORT_WATCH_SECONDS = 1.0  # a watch that ends sooner than this without any event counts as a failure


def obj_name(obj: Obj) -> str | None:
    return (obj.get("metadata") or {}).get("name")


def obj_version(obj: Obj) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion")


class Expired(Exception):
    """The resourceVersion is too old (410 Gone): only a new list helps."""


class WatchFailed(Exception):
    """A watch that went wrong without an API status (garbage on the stream, an empty watch ending at once)."""


class Informer:
    def __init__(
        self,
        *,
        name: str,
        list_func: Callable[..., Any],
        namespace: str,
        list_kwargs: dict[str, Any] | None = None,
        accept: Callable[[Obj], bool] | None = None,
        index: Callable[[Obj], str | None] | None = None,
        resync_seconds: float = 60.0,
        watch_timeout: int = 300,
        retry_base: float = 0.5,
        retry_cap: float = 30.0,
        on_relist: Callable[[], None] | None = None,
        on_resync: Callable[[list[Obj]], None] | None = None,
    ):
        self.name = name
        self.list_func = list_func
        self.namespace = namespace
        self.list_kwargs = dict(list_kwargs or {})
        self.accept = accept or (lambda obj: True)
        self.index_key = index
        self.resync_seconds = resync_seconds
        self.watch_timeout = max(1, int(watch_timeout))
        self.retry_base = retry_base
        self.retry_cap = retry_cap
        self.on_relist = on_relist
        self.on_resync = on_resync

        self.synced = threading.Event()
        self.resource_version: str | None = None
        # For tests and metrics.
        self.relists = 0  # full lists done
        self.watches = 0  # watch requests started
        self.errors = 0  # failed lists and watches, 410s aside
        self.expired = 0  # 410 Gone seen (HTTP status or ERROR event)
        self.resyncs = 0  # resync ticks (each hands the cache to on_resync, when there is one)
        self.last_activity: float | None = None  # time.monotonic() of the last successful list, event or bookmark

        self._cache: dict[str, Obj] = {}
        self._index: dict[str, set[str]] = {}
        self._lock = threading.RLock()
        self._hook_lock = threading.Lock()  # on_relist and on_resync never overlap
        self._stopping = threading.Event()
        self._relist_requested = threading.Event()
        self._wake = threading.Event()  # ends a backoff early (stop, request_relist)
        self._failures = 0  # consecutive failures, for the backoff
        self._resp: Any = None  # the open watch response, so that it can be cut
        self._thread: threading.Thread | None = None
        self._resync_thread: threading.Thread | None = None

    # --- reading ---------------------------------------------------------------------------------------

    def get(self, name: str) -> Obj | None:
        with self._lock:
            return self._cache.get(name)

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._cache.values())

    def indexed(self, key: str) -> list[Obj]:
        with self._lock:
            return [self._cache[n] for n in self._index.get(key, ()) if n in self._cache]

    def lag_seconds(self) -> float | None:
        """Seconds since the last successful list, event or bookmark (None before the first)."""
        last = self.last_activity
        return None if last is None else max(0.0, time.monotonic() - last)

    # --- writing (also used by callers that read an object directly) -----------------------------------

    def upsert(self, obj: Obj) -> None:
        name = obj_name(obj)
        if not name:
            return
        with self._lock:
            if not self.accept(obj):
                self._remove(name)
                return
            old = self._cache.get(name)
            if old is not None:
                self._unindex(name, old)
            self._cache[name] = obj
            if self.index_key:
                key = self.index_key(obj)
                if key is not None:
                    self._index.setdefault(key, set()).add(name)

    def remove(self, name: str) -> None:
        with self._lock:
            self._remove(name)

    def _remove(self, name: str) -> None:
        old = self._cache.pop(name, None)
        if old is not None:
            self._unindex(name, old)

    def _unindex(self, name: str, obj: Obj) -> None:
        if self.index_key:
            key = self.index_key(obj)
            names = self._index.get(key)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._index[key]

    # --- lifecycle ---------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stopping.clear()
        self._wake.clear()
        self._thread = threading.Thread(target=self._run, name=f"k8s-informer-{self.name}", daemon=True)
        self._thread.start()
        if self.resync_seconds > 0:
            self._resync_thread = threading.Thread(target=self._resync_loop, name=f"k8s-resync-{self.name}",
                                                   daemon=True)
            self._resync_thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        self._interrupt(lambda: thread is None or not thread.is_alive(), timeout)
        resync = self._resync_thread
        if resync is not None and resync is not threading.current_thread():
            resync.join(max(0.0, deadline - time.monotonic()))
        self._thread = self._resync_thread = None

    def request_relist(self, timeout: float = 5.0) -> None:
        """Relist now (also cutting a backoff short): end the current watch and wait until the relist has started."""
        self._relist_requested.set()
        self._wake.set()
        self._interrupt(lambda: not self._relist_requested.is_set() or not self.running, timeout)

    def _interrupt(self, done: Callable[[], bool], timeout: float) -> None:
        """Cut the open watch connection until ``done`` (a watch may be between its request and its response)."""
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            resp = self._resp
            if resp is not None:
                _cut(resp)
            time.sleep(0.02)

    def wait_synced(self, timeout: float) -> bool:
        return self.synced.wait(timeout)

    # --- the loop ----------------------------------------------------------------------------------------

    def _interrupted(self) -> bool:
        return self._stopping.is_set() or self._relist_requested.is_set()

    def _run(self) -> None:
        need_list = True
        while not self._stopping.is_set():
            try:
                if need_list or self._relist_requested.is_set():
                    self._relist_requested.clear()
                    self._relist()
                    need_list = False
                    self._call_hook("after-relist", self.on_relist)
                self._watch_once()
            except Expired as exc:
                if self._stopping.is_set():
                    break
                self.expired += 1
                self.resource_version = None
                need_list = True
                self._backoff(f"expired ({exc}), relisting")
            except ApiException as exc:
                if self._stopping.is_set():
                    break
                if exc.status == GONE:
                    self.expired += 1
                    self.resource_version = None
                    need_list = True
                    self._backoff(f"expired (HTTP 410 {exc.reason}), relisting")
                    continue
                self.errors += 1
                if exc.status and 400 <= exc.status < 500 and exc.status != 429:
                    need_list = True  # a client-side problem with our request: start over
                self._backoff(f"API error {exc.status} {exc.reason}" + (", relisting" if need_list else ""),
                              level=logging.WARNING)
            except Exception as exc:  # network and the like: resume the watch from where it was
                if self._stopping.is_set():
                    break
                self.errors += 1
                self._backoff(f"{type(exc).__name__}: {exc}", level=logging.WARNING)
        self._resp = None

    def _backoff(self, why: str, level: int = logging.INFO) -> None:
        """Wait before the next attempt: exponential in the consecutive failures, jittered, cut short by stop or
        request_relist."""
        self._failures += 1
        delay = min(self.retry_cap, self.retry_base * 2 ** (self._failures - 1)) * random.uniform(0.5, 1.0)
        log.log(level, "%s informer: %s; retrying in %.2f s (failure %d in a row)", self.name, why, delay,
                self._failures)
        self._wake.clear()
        if not self._interrupted():
            self._wake.wait(delay)

    def _call_hook(self, what: str, hook: Callable[..., None] | None, *args: Any) -> None:
        if hook is None:
            return
        with self._hook_lock:
            try:
                hook(*args)
            except Exception:
                log.exception("%s informer: %s hook failed", self.name, what)

    def _resync_loop(self) -> None:
        while not self._stopping.wait(self.resync_seconds):
            if not self.synced.is_set():
                continue
            self.resyncs += 1
            if self.on_resync is not None:
                self._call_hook("resync", self.on_resync, self.items())

    def _relist(self) -> None:
        items: dict[str, Obj] = {}
        version = None
        token = None
        while True:
            kwargs = dict(self.list_kwargs, limit=500, _preload_content=False, _request_timeout=(10, 120))
            if token:
                kwargs["_continue"] = token
            resp = self.list_func(self.namespace, **kwargs)
            data = json.loads(resp.data or b"{}")
            for obj in data.get("items") or []:
                name = obj_name(obj)
                if name and self.accept(obj):
                    items[name] = obj
            meta = data.get("metadata") or {}
            version = meta.get("resourceVersion") or version
            token = meta.get("continue")
            if not token:
                break
        with self._lock:
            self._cache.clear()
            self._index.clear()
            for obj in items.values():
                self.upsert(obj)
        self.resource_version = version
        self.relists += 1
        self.last_activity = time.monotonic()
        self.synced.set()

    def _watch_once(self) -> None:
        """One watch request, read to its end. Returns when the server ends it (or we cut it); raises otherwise."""
        timeout = self.watch_timeout
        # The server ends the watch after `timeout`; the read timeout covers a server that ignores it.
        kwargs = dict(self.list_kwargs, watch=True, timeout_seconds=timeout, allow_watch_bookmarks=True,
                      _preload_content=False, _request_timeout=(10, timeout + 5))
        if self.resource_version:
            kwargs["resource_version"] = self.resource_version
        if self._interrupted():
            return
        self.watches += 1
        started = time.monotonic()
        delivered = 0
        resp = self.list_func(self.namespace, **kwargs)  # an HTTP error status raises ApiException here
        self._resp = resp
        try:
            for line in _lines(resp):
                if self._interrupted():
                    return
                try:
                    event = json.loads(line)
                except ValueError as exc:
                    raise WatchFailed(f"not a watch event: {line[:200]!r}") from exc
                self._apply(event)
                delivered += 1
                self._failures = 0  # the server is answering: whatever failed before is over
        except Exception as exc:
            if self._interrupted():
                return  # we cut the connection ourselves
            if not _is_read_timeout(exc):
                raise
            # a silent watch that outlived its server timeout: it ran its course
        finally:
            self._resp = None
            resp.close()
            resp.release_conn()
        if self._interrupted():
            return
        if not delivered and time.monotonic() - started < SHORT_WATCH_SECONDS:
            raise WatchFailed("the watch ended at once without any event")
        self._failures = 0

    def _apply(self, event: dict) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            obj = {}
        if kind == "ERROR":
            code = obj.get("code")
            reason = f"{obj.get('reason') or ''}: {obj.get('message') or ''}"
            if code == GONE:
                raise Expired(reason)
            raise ApiException(status=code or 500, reason=f"watch ERROR event {reason}")
        version = obj_version(obj)
        self.last_activity = time.monotonic()
        if kind == "BOOKMARK":
            if version:
                self.resource_version = version
            return
        name = obj_name(obj)
        if name is None:
            return
        if kind in ("ADDED", "MODIFIED"):
            self.upsert(obj)
        elif kind == "DELETED":
            self.remove(name)
        if version:
            self.resource_version = version


def _lines(resp: Any) -> Iterator[str]:
    """The non-empty lines of a streamed (chunked) response, as they arrive."""
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk if isinstance(chunk, bytes) else str(chunk).encode()
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield line.decode("utf-8", errors="replace")
    if buffer.strip():
        yield buffer.decode("utf-8", errors="replace")


def _cut(resp: Any) -> None:
    """Shut the watch's socket down, so that a read blocked on it returns now."""
    try:
        resp.shutdown()
        return
    except Exception:
        pass
    try:
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except Exception:
        pass


def _is_read_timeout(exc: BaseException) -> bool:
    from urllib3.exceptions import ReadTimeoutError

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ReadTimeoutError | TimeoutError):
            return True
        exc = exc.__cause__ or exc.__context__ or (exc.args[1] if len(getattr(exc, "args", ())) > 1
                                                   and isinstance(exc.args[1], BaseException) else None)
    return False
