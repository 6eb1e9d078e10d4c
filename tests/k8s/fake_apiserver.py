"""A scripted fake Kubernetes API server for the informer tests: pod LIST and WATCH, as they look on the wire.

It answers ``GET /api/v1/namespaces/<ns>/pods``: a list (JSON with ``metadata.resourceVersion`` and ``items``)
or, with ``watch=true`` (the official client sends ``watch=True``), a chunked stream of JSON lines, one event
each, as the API server writes them. Every answer is scripted per test, in order of the requests:

- ``lists``: each a ``PodList(version, items)`` or an HTTP status (an int, answered with a ``Status`` body);
  when they run out, ``default_list`` answers.
- ``watches``: each a list of steps or an HTTP status. A step is an event (``event``, ``bookmark``,
  ``expired``, ``error_event``) written as one line, or ``HOLD``: keep the stream open, silent, until the
  request's ``timeoutSeconds`` or the server stops. After the last step the stream ends, as the real server
  ends a watch after an ERROR event. When they run out, ``default_watch`` answers.

``journal`` records every request (kind, path, query, arrival time) and ``sent`` every event written (with the
time it was flushed), both with ``time.monotonic()``, so that tests measure delays on the server's side.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web

HOLD = "hold"


@dataclass
class PodList:
    version: str
    items: list[dict] = field(default_factory=list)


@dataclass
class Request:
    kind: str  # "list" or "watch"
    path: str
    query: dict[str, str]
    at: float  # time.monotonic() on arrival

    @property
    def resource_version(self) -> str | None:
        return self.query.get("resourceVersion")


@dataclass
class Sent:
    type: str
    watch: int  # index of the watch request in the journal's watches
    at: float  # time.monotonic() once written


def pod(name: str, version: str, namespace: str = "ns", **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": version, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


def event(kind: str, obj: dict) -> dict:
    return {"type": kind, "object": obj}


def bookmark(version: str) -> dict:
    return {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                           "metadata": {"resourceVersion": version, "creationTimestamp": None}}}


def status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def error_event(code: int, reason: str, message: str) -> dict:
    return {"type": "ERROR", "object": status(code, reason, message)}


def expired(old: str = "123", oldest: str = "456") -> dict:
    """The ERROR event a real API server sends when the watch's resourceVersion has been compacted away."""
    return error_event(410, "Expired", f"too old resource version: {old} ({oldest})")


class ThreadedApp:
    """An aiohttp app on 127.0.0.1:<free port>, in a thread with its own event loop; ``routes`` adds its handlers,
    which may wait on ``_stopping`` (set by ``stop``)."""

    thread_name = "fake-apiserver"

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),),
                                        name=self.thread_name, daemon=True)
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def routes(self, app: aiohttp.web.Application) -> None:
        raise NotImplementedError

    def start(self):
        self._thread.start()
        if not self._ready.wait(10) or self.port is None:
            raise RuntimeError(f"{self.thread_name} did not start")
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(10)

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        app = aiohttp.web.Application()
        self.routes(app)
        runner = aiohttp.web.AppRunner(app, shutdown_timeout=1)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            await runner.cleanup()


class FakeApiServer(ThreadedApp):
    """On 127.0.0.1:<free port>, in a thread with its own event loop."""

    def __init__(self, namespace: str = "ns"):
        self.namespace = namespace
        self.lists: list[PodList | int] = []
        self.watches: list[list | int] = []
        self.default_list: PodList | int = PodList("1")
        self.default_watch: list | int = [HOLD]
        self.journal: list[Request] = []
        self.sent: list[Sent] = []
        self._lock = threading.Lock()
        super().__init__()

    # --- for tests -----------------------------------------------------------------------------------------

    def requests(self, kind: str) -> list[Request]:
        with self._lock:
            return [r for r in self.journal if r.kind == kind]

    def sent_of(self, kind: str) -> list[Sent]:
        with self._lock:
            return [s for s in self.sent if s.type == kind]

    # --- serving -------------------------------------------------------------------------------------------

    def routes(self, app: aiohttp.web.Application) -> None:
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._pods)

    async def _pods(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        query = dict(request.query)
        is_watch = query.get("watch", "").lower() == "true"
        with self._lock:
            self.journal.append(Request("watch" if is_watch else "list", request.path, query, time.monotonic()))
            if is_watch:
                index = sum(1 for r in self.journal if r.kind == "watch") - 1
                answer: Any = self.watches.pop(0) if self.watches else self.default_watch
            else:
                answer = self.lists.pop(0) if self.lists else self.default_list
        if request.match_info["namespace"] != self.namespace:
            return _status_response(404, "NotFound", "no such namespace here")
        if isinstance(answer, int):
            reason = "Expired" if answer == 410 else "Injected"
            return _status_response(answer, reason, f"scripted {answer}")
        if not is_watch:
            return aiohttp.web.json_response({"kind": "PodList", "apiVersion": "v1",
                                              "metadata": {"resourceVersion": answer.version},
                                              "items": answer.items})
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            for step in answer:
                if step == HOLD:
                    try:
                        await asyncio.wait_for(self._stopping.wait(), float(query.get("timeoutSeconds", 300)))
                    except TimeoutError:
                        pass
                    break
                await resp.write(json.dumps(step).encode() + b"\n")
                with self._lock:
                    self.sent.append(Sent(step["type"], index, time.monotonic()))
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client went away
        return resp


def _status_response(code: int, reason: str, message: str) -> aiohttp.web.Response:
    return aiohttp.web.json_response(status(code, reason, message), status=code)
