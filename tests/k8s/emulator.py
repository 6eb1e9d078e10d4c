"""kmock's KubernetesEmulator over HTTP in a background thread, with the gaps DESIGN.md §5 lists closed.

kmock 0.8 starts a watch only for ``watch=true`` while the official client sends ``watch=True`` (normalised here
before the request is handed on), and matches watch events by the object's own metadata.namespace (the backend
always sets it). On top: pod logs served from ``logs``, scripted failures (``fail``) and a request journal.

Standalone, for trying the dashboard against it: ``python -m tests.k8s.emulator [--port 8001]`` serves until
interrupted and prints a kubeconfig to use as KUBECONFIG; the pods it holds are patched by hand (there is no
kubelet).
"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import dataclass

import aiohttp.web
import kmock
from kubernetes import client

LOG_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")


@dataclass
class Failure:
    method: str
    path: re.Pattern
    status: int
    times: int
    after: bool = False  # apply the request, then answer with the error (the answer is "lost")
    watch: bool | None = None  # only watch requests (True), only others (False), or both (None)
    skip: int = 0  # let this many matching requests through first
    hits: int = 0
    seen: int = 0


def status_body(code: int, reason: str, message: str) -> dict:
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "code": code,
            "reason": reason, "message": message}


class Emulator(kmock.KubernetesEmulator):
    """KubernetesEmulator plus watch=True, pod logs, scripted failures and a request journal."""

    def setup(self) -> None:
        # Known resources answer lists and watches even while they have no objects.
        for plural, kind, namespaced in [("pods", "Pod", True), ("services", "Service", True),
                                         ("events", "Event", True), ("nodes", "Node", False)]:
            self.resources[f"v1/{plural}"] = kmock.ResourceInfo(kind=kind, namespaced=namespaced)
        self.logs: dict[tuple[str, str], str] = {}
        self.failures: list[Failure] = []
        self.journal: list[tuple[str, str, dict, str | None]] = []  # method, path, query, User-Agent

    def fail(self, method: str, path: str, status: int = 500, times: int = 1, *, after: bool = False,
             watch: bool | None = None, skip: int = 0) -> Failure:
        failure = Failure(method.upper(), re.compile(path), status, times, after, watch, skip)
        self.failures.append(failure)
        return failure

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        query = dict(raw_request.query)
        if query.get("watch", "").lower() == "true" and query["watch"] != "true":
            query["watch"] = "true"
            raw_request = raw_request.clone(rel_url=raw_request.rel_url.with_query(query))
        self.journal.append((raw_request.method, raw_request.path, query, raw_request.headers.get("User-Agent")))
        is_watch = query.get("watch") == "true"
        for f in self.failures:
            if (f.hits < f.times and f.method == raw_request.method and f.path.search(raw_request.path)
                    and (f.watch is None or f.watch == is_watch)):
                f.seen += 1
                if f.seen <= f.skip:
                    continue
                f.hits += 1
                if f.after:
                    await super().__call__(raw_request)
                return aiohttp.web.json_response(status_body(f.status, "Injected", f"injected {f.status}"),
                                                 status=f.status)
        m = LOG_PATH.match(raw_request.path)
        if m and raw_request.method == "GET":
            key = (m.group(1), m.group(2))
            if ("pods", key) not in self._pod_keys():
                return aiohttp.web.json_response(status_body(404, "NotFound", f'pods "{key[1]}" not found'),
                                                 status=404)
            return aiohttp.web.Response(text=self.logs.get(key, ""), content_type="text/plain")
        return await super().__call__(raw_request)

    def _pod_keys(self) -> set:
        keys = set()
        for (resource, namespace, name), obj in list(self.objects.items()):
            if resource.plural == "pods" and not obj.deleted:
                keys.add(("pods", (namespace, name)))
        return keys


class EmulatorServer:
    """The emulator on 127.0.0.1:<free port>, in a thread with its own event loop."""

    def __init__(self, port: int | None = None):
        self.emu = Emulator()
        self._port = port
        self.emu.setup()
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.port: int | None = None
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self.ready.set()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with self.emu, kmock.Server(self.emu, port=self._port) as server:
            self.port = server.port
            self.ready.set()
            await self._stop.wait()

    def start(self) -> EmulatorServer:
        self._thread.start()
        self.ready.wait(10)
        if self._error or self.port is None:
            raise RuntimeError(f"the emulator did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api_client(self) -> client.ApiClient:
        return client.ApiClient(client.Configuration(host=self.url))


def kubeconfig(url: str) -> str:
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
        f"clusters: [{{name: emu, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: tester, user: {token: test-token}}]\n"
        "contexts: [{name: emu, context: {cluster: emu, user: tester}}]\n"
    )


def main() -> None:
    import argparse
    import time

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args()
    server = EmulatorServer(port=args.port).start()
    print(kubeconfig(server.url), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
