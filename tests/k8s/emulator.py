"""kmock's KubernetesEmulator over HTTP in a background thread, with the gaps DESIGN.md §5 lists closed.

kmock 0.8 starts a watch only for ``watch=true`` while the official client sends ``watch=True`` (normalised here
before the request is handed on), and matches watch events by the object's own metadata.namespace (the backend
always sets it). On top: pod logs served from ``logs`` like the kubelet serves them (see ``Emulator.emit``),
scripted failures (``fail``) and a request journal.

Standalone, for trying the dashboard against it: ``python -m tests.k8s.emulator [--port 8001]`` serves until
interrupted and prints a kubeconfig to use as KUBECONFIG; the pods it holds are patched by hand (there is no
kubelet).
"""

from __future__ import annotations

import asyncio
import bisect
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

import aiohttp.web
import kmock
from kubernetes import client

LOG_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")
# The timestamp of every line of a log given as a plain str (``logs[key] = "text"``): one fixed, old instant.
PLAIN_LOG_NS = 946_684_800 * 10**9  # 2000-01-01T00:00:00Z

LogEntry = tuple[int, str]  # (timestamp in ns since the epoch, one line, with its "\n" unless it is the last)


def log_timestamp(ns: int) -> str:
    """A log line's timestamp as the kubelet writes it: RFC3339 with nanoseconds, always nine digits."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns % 10**9:09d}Z"


def parse_time(value: str) -> int:
    """RFC3339 (any fraction, Z or an offset) to ns since the epoch."""
    m = re.fullmatch(r"(.{19})(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", value.strip())
    if not m:
        raise ValueError(f"not an RFC3339 time: {value!r}")
    offset = "+00:00" if m.group(3) == "Z" else m.group(3)
    seconds = int(datetime.fromisoformat(m.group(1) + offset).timestamp())
    return seconds * 10**9 + int((m.group(2) or "").ljust(9, "0"))


@dataclass
class Failure:
    method: str
    path: re.Pattern
    status: int
    times: int
    after: bool = False  # apply the request, then answer with the error (the answer is "lost")
    watch: bool | None = None  # only watch requests (True), only others (False), or both (None)
    skip: int = 0  # let this many matching requests through first
    headers: dict[str, str] = field(default_factory=dict)  # added to the error answer, e.g. Retry-After
    hits: int = 0
    seen: int = 0


def status_body(code: int, reason: str, message: str) -> dict:
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "code": code,
            "reason": reason, "message": message}


class Emulator(kmock.KubernetesEmulator):
    """KubernetesEmulator plus watch=True, pod logs, scripted failures and a request journal.

    Pod logs, per (namespace, pod): ``logs[key]`` is either a plain str (every line then has the timestamp
    ``PLAIN_LOG_NS``, one fixed old instant) or a list of ``(ns, line)`` entries, which ``emit`` appends with
    increasing timestamps. ``restart_container`` moves the current log to ``previous_logs`` (``previous=true``).
    The log endpoint serves ``timestamps``, ``sinceTime`` (lines at or after it), ``tailLines`` and ``limitBytes``
    (the body cut at that many bytes, even mid-line) as the kubelet does; ``log_requests`` counts every GET of a
    log (injected failures included) and ``log_bytes_served`` the bytes of the bodies served.
    """

    def setup(self) -> None:
        # Known resources answer lists and watches even while they have no objects.
        for plural, kind, namespaced in [("pods", "Pod", True), ("services", "Service", True),
                                         ("events", "Event", True), ("nodes", "Node", False)]:
            self.resources[f"v1/{plural}"] = kmock.ResourceInfo(kind=kind, namespaced=namespaced)
        self.resources["networking.k8s.io/v1/networkpolicies"] = kmock.ResourceInfo(kind="NetworkPolicy",
                                                                                namespaced=True)
        # The gang schedulers' PodGroups (custom resources, as if their CRDs were installed): kmock stores objects
        # of any API group it is sent, but lists only resources it knows.
        for group_version in ("scheduling.x-k8s.io/v1alpha1", "scheduling.volcano.sh/v1beta1"):
            self.resources[f"{group_version}/podgroups"] = kmock.ResourceInfo(kind="PodGroup", namespaced=True)
        self.logs: dict[tuple[str, str], str | list[LogEntry]] = {}
        self.previous_logs: dict[tuple[str, str], str | list[LogEntry]] = {}
        self.log_requests = 0
        self.log_bytes_served = 0
        self._last_log_ns = 0
        self.failures: list[Failure] = []
        self.journal: list[tuple[str, str, dict, str | None]] = []  # method, path, query, User-Agent

    def fail(self, method: str, path: str, status: int = 500, times: int = 1, *, after: bool = False,
             watch: bool | None = None, skip: int = 0, headers: dict[str, str] | None = None) -> Failure:
        failure = Failure(method.upper(), re.compile(path), status, times, after, watch, skip, dict(headers or {}))
        self.failures.append(failure)
        return failure

    # --- pod logs ----------------------------------------------------------------------------------------

    def emit(self, namespace: str, pod: str, text: str, *, at: datetime | str | int | None = None,
             step_ns: int = 1000) -> list[LogEntry]:
        """Append ``text``'s lines to the pod's log, as the container runtime records them.

        Timestamps: from ``at`` (a datetime, an RFC3339 str or ns) when given, else from now, never before the
        last line emitted; each further line ``step_ns`` later (0: every line the same timestamp). A last line
        without "\n" is kept as it is (output the process has not ended yet). Returns the entries added.
        """
        key = (namespace, pod)
        entries = self._entries(self.logs, key)
        if at is None:
            start = max(time.time_ns(), self._last_log_ns + 1)
        elif isinstance(at, datetime):
            start = int(at.timestamp()) * 10**9 + at.microsecond * 1000
        elif isinstance(at, str):
            start = parse_time(at)
        else:
            start = int(at)
        lines = text.splitlines(keepends=True)
        added = [(start + i * step_ns, line) for i, line in enumerate(lines)]
        if added and entries and added[0][0] < entries[-1][0]:
            raise ValueError("a log's timestamps never go back")
        entries.extend(added)
        if added:
            self._last_log_ns = max(self._last_log_ns, added[-1][0])
        return added

    def restart_container(self, namespace: str, pod: str) -> None:
        """The container restarted in place: its log so far becomes the previous one, the current one starts empty."""
        key = (namespace, pod)
        self.previous_logs[key] = self._entries(self.logs, key)
        self.logs[key] = []

    @staticmethod
    def _entries(store: dict, key: tuple[str, str]) -> list[LogEntry]:
        value = store.get(key)
        if not isinstance(value, list):
            value = [(PLAIN_LOG_NS, line) for line in (value or "").splitlines(keepends=True)]
            store[key] = value
        return value

    def _serve_log(self, key: tuple[str, str], query: dict) -> aiohttp.web.Response:
        previous = query.get("previous", "").lower() == "true"
        store = self.previous_logs if previous else self.logs
        if previous and key not in store:
            message = f'previous terminated container "main" in pod "{key[1]}" not found'
            return aiohttp.web.json_response(status_body(400, "BadRequest", message), status=400)
        value = store.get(key) or []
        entries = ([(PLAIN_LOG_NS, line) for line in value.splitlines(keepends=True)] if isinstance(value, str)
                   else value)
        try:
            start = bisect.bisect_left(entries, (parse_time(query["sinceTime"]),)) if "sinceTime" in query else 0
            tail = int(query["tailLines"]) if "tailLines" in query else None
            limit = int(query["limitBytes"]) if "limitBytes" in query else None
        except ValueError as exc:
            return aiohttp.web.json_response(status_body(400, "BadRequest", str(exc)), status=400)
        if tail is not None:
            start = max(start, len(entries) - tail)
        stamped = query.get("timestamps", "").lower() == "true"
        chunks, size = [], 0
        for ns, line in entries[start:]:
            chunk = (f"{log_timestamp(ns)} {line}" if stamped else line).encode()
            chunks.append(chunk)
            size += len(chunk)
            if limit is not None and size >= limit:
                break
        body = b"".join(chunks)
        if limit is not None:
            body = body[:limit]
        self.log_bytes_served += len(body)
        return aiohttp.web.Response(body=body, content_type="text/plain")

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        query = dict(raw_request.query)
        if query.get("watch", "").lower() == "true" and query["watch"] != "true":
            query["watch"] = "true"
            raw_request = raw_request.clone(rel_url=raw_request.rel_url.with_query(query))
        self.journal.append((raw_request.method, raw_request.path, query, raw_request.headers.get("User-Agent")))
        log_path = LOG_PATH.match(raw_request.path) if raw_request.method == "GET" else None
        if log_path:
            self.log_requests += 1
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
                                                 status=f.status, headers=f.headers)
        if log_path:
            key = (log_path.group(1), log_path.group(2))
            if ("pods", key) not in self._pod_keys():
                return aiohttp.web.json_response(status_body(404, "NotFound", f'pods "{key[1]}" not found'),
                                                 status=404)
            return self._serve_log(key, query)
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
