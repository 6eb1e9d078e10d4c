"""A small informer: list, then watch, a namespaced resource in a background thread into an in-memory cache.

It keeps ``{name: object}`` (the API's JSON) current: a full list first and after every ``resync_seconds``, a watch
in between that resumes from the last resourceVersion after an error and relists after 410 Gone. It does not rely
on the server for what it can check itself: objects are filtered by ``accept`` on the client too (an emulator or
an old server may ignore selectors), a missing resourceVersion just means the next watch starts from "now", and
the watch is bounded by a client read timeout as well as the server timeout. ``stop()`` ends it at once.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

Obj = dict[str, Any]


def obj_name(obj: Obj) -> str | None:
    return (obj.get("metadata") or {}).get("name")


def obj_version(obj: Obj) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion")


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
        on_relist: Callable[[], None] | None = None,
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
        self.on_relist = on_relist

        self.synced = threading.Event()
        self.resource_version: str | None = None
        self.relists = 0  # full lists done (for tests and metrics)
        self.watches = 0  # watch requests started
        self.errors = 0
        self._cache: dict[str, Obj] = {}
        self._index: dict[str, set[str]] = {}
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._relist_requested = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None
        self._next_resync = 0.0

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
        self._thread = threading.Thread(target=self._run, name=f"k8s-informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        thread = self._thread
        self._interrupt(lambda: thread is None or not thread.is_alive(), timeout)
        self._thread = None

    def request_relist(self, timeout: float = 5.0) -> None:
        """Relist now: end the current watch request and wait until the relist has started."""
        self._relist_requested.set()
        self._interrupt(lambda: not self._relist_requested.is_set() or not self.running, timeout)

    def _interrupt(self, done: Callable[[], bool], timeout: float) -> None:
        """Cut the open watch connection until ``done`` (a watch may be between creation and its request)."""
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            w = self._watch
            if w is not None:
                w.stop()  # shuts the socket down, so a blocked read returns now
            time.sleep(0.02)

    def wait_synced(self, timeout: float) -> bool:
        return self.synced.wait(timeout)

    # --- the loop ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        delay = self.retry_base
        need_list = True
        while not self._stopping.is_set():
            try:
                if need_list or self._relist_requested.is_set() or time.monotonic() >= self._next_resync:
                    self._relist_requested.clear()
                    self._relist()
                    need_list = False
                    if self.on_relist is not None:
                        try:
                            self.on_relist()
                        except Exception:
                            log.exception("%s informer: after-relist hook failed", self.name)
                self._watch_once()
                delay = self.retry_base
            except ApiException as exc:
                if self._stopping.is_set():
                    break
                self.errors += 1
                if exc.status == 410:  # our resourceVersion is too old: start again from a fresh list
                    log.info("%s informer: watch expired (410 Gone), relisting", self.name)
                    self.resource_version = None
                    need_list = True
                    continue
                log.warning("%s informer: API error %s %s, retrying in %.1f s", self.name, exc.status, exc.reason,
                            delay)
                if exc.status and 400 <= exc.status < 500 and exc.status != 429:
                    need_list = True  # a client-side problem with our request: start over
                self._stopping.wait(delay)
                delay = min(delay * 2, 30.0)
            except Exception as exc:  # network: resume the watch from where it was
                if self._stopping.is_set():
                    break
                self.errors += 1
                log.warning("%s informer: %s, retrying in %.1f s", self.name, exc, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, 30.0)
        self._watch = None

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
        self._next_resync = time.monotonic() + self.resync_seconds
        self.synced.set()

    def _watch_once(self) -> None:
        remaining = max(1, math.ceil(self._next_resync - time.monotonic()))
        timeout = min(self.watch_timeout, remaining)
        # The server ends the watch after `timeout`; the read timeout covers a server that ignores it.
        kwargs = dict(self.list_kwargs, timeout_seconds=timeout, allow_watch_bookmarks=True, deserialize=False,
                      _request_timeout=(10, timeout + 2))
        if self.resource_version:
            kwargs["resource_version"] = self.resource_version
        w = watch.Watch()
        self._watch = w
        if self._stopping.is_set():
            return
        self.watches += 1
        try:
            for event in w.stream(self.list_func, self.namespace, **kwargs):
                self._apply(event)
                if (self._stopping.is_set() or self._relist_requested.is_set()
                        or time.monotonic() >= self._next_resync):
                    break
        except Exception as exc:
            if self._stopping.is_set() or self._relist_requested.is_set():
                return  # we cut the connection ourselves
            if _is_read_timeout(exc):
                return  # an idle watch: start the next one
            raise
        finally:
            self._watch = None

    def _apply(self, event: dict) -> None:
        kind = event.get("type")
        obj = event.get("object") or event.get("raw_object") or {}
        version = obj_version(obj) if isinstance(obj, dict) else None
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
