"""A fake Kubernetes API server for the gateway's tests (kmock, the emulator, has no exec nor port-forward): pod GET,
and the two WebSocket subresources as the API server speaks them.

- ``GET /api/v1/namespaces/<ns>/pods/<name>``: ``pods[name]``, else a 404 Status.
- ``.../pods/<name>/exec?command=...&container=...&stdin=...&tty=...``: subprotocol ``v4.channel.k8s.io``; every
  message is a channel byte then data: 0 stdin, 1 stdout, 2 stderr, 3 error (one Status when the command ends:
  Success, or NonZeroExitCode with the code in ``details.causes``), 4 resize (JSON, recorded in ``resizes``). The
  "container" runs the command as a process of this machine (no terminal even with tty).
- ``.../pods/<name>/portforward?ports=P``: subprotocol ``v4.channel.k8s.io`` (or ``portforward.k8s.io`` if that is
  all the client offers); channel 0 data, 1 errors, each first sent the port as 2 bytes little-endian; port P of the
  pod is ``forwards[(name, P)]``, a (host, port) of this machine; none: an error on channel 1, then close.

``journal`` records (method, path, query) of every request, ``ended`` the exit status of every command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
import aiohttp.web

from .fake_apiserver import ThreadedApp

PROTOCOLS = ["v4.channel.k8s.io", "portforward.k8s.io"]
STDIN, STDOUT, STDERR, ERROR, RESIZE = 0, 1, 2, 3, 4


def exit_status(code: int, command: list[str]) -> dict:
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: error executing command {command}, "
                       f"exit code {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


class FakeExecApiServer(ThreadedApp):
    """On 127.0.0.1:<free port>, in a thread with its own event loop."""

    thread_name = "fake-exec-apiserver"

    def __init__(self, namespace: str):
        self.namespace = namespace
        self.pods: dict[str, dict] = {}
        self.forwards: dict[tuple[str, int], tuple[str, int]] = {}
        self.journal: list[tuple[str, str, dict]] = []
        self.resizes: list[dict] = []
        self.execs: list[dict] = []
        self.ended: list[int] = []  # the exit status of each command, -9 when its session closed first
        super().__init__()

    def routes(self, app: aiohttp.web.Application) -> None:
        base = "/api/v1/namespaces/{namespace}/pods/{name}"
        app.router.add_get(base, self._pod)
        app.router.add_get(base + "/exec", self._exec)
        app.router.add_get(base + "/portforward", self._portforward)

    def _record(self, request: aiohttp.web.Request) -> aiohttp.web.Response | None:
        self.journal.append((request.method, request.path, dict(request.query)))
        name = request.match_info["name"]
        if request.match_info["namespace"] != self.namespace or name not in self.pods:
            return aiohttp.web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                              "reason": "NotFound", "code": 404,
                                              "message": f'pods "{name}" not found'}, status=404)
        return None

    async def _pod(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        return self._record(request) or aiohttp.web.json_response(self.pods[request.match_info["name"]])

    async def _exec(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        if (missing := self._record(request)) is not None:
            return missing
        command = request.query.getall("command")
        self.execs.append({"pod": request.match_info["name"], "command": command,
                           "container": request.query.get("container"), "tty": request.query.get("tty")})
        ws = aiohttp.web.WebSocketResponse(protocols=PROTOCOLS)
        await ws.prepare(request)
        proc = await asyncio.create_subprocess_exec(*command, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

        async def output(stream, channel):
            while data := await stream.read(65536):
                await ws.send_bytes(bytes([channel]) + data)

        async def inputs():
            async for message in ws:
                if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                    continue
                channel, data = message.data[0], message.data[1:]
                if channel == STDIN:
                    proc.stdin.write(data)
                    with contextlib.suppress(ConnectionError):
                        await proc.stdin.drain()
                elif channel == RESIZE:
                    self.resizes.append(json.loads(data))
            if proc.returncode is None:  # the client went: the command ends with its session
                proc.kill()

        reader = asyncio.ensure_future(inputs())
        await asyncio.gather(output(proc.stdout, STDOUT), output(proc.stderr, STDERR))
        code = await proc.wait()
        self.ended.append(code)
        if not ws.closed:
            await ws.send_bytes(bytes([ERROR]) + json.dumps(exit_status(code, command)).encode())
            await ws.close()
        reader.cancel()
        return ws

    async def _portforward(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        if (missing := self._record(request)) is not None:
            return missing
        port = int(request.query["ports"])
        ws = aiohttp.web.WebSocketResponse(protocols=PROTOCOLS)
        await ws.prepare(request)
        prefix = port.to_bytes(2, "little")
        await ws.send_bytes(bytes([0]) + prefix)
        await ws.send_bytes(bytes([1]) + prefix)
        target = self.forwards.get((request.match_info["name"], port))
        try:
            if target is None:
                raise ConnectionRefusedError(f"nothing listens on port {port}")
            reader, writer = await asyncio.open_connection(*target)
        except OSError as exc:
            await ws.send_bytes(bytes([1]) + f"an error occurred forwarding {port}: {exc}".encode())
            await ws.close()
            return ws

        async def to_pod():
            async for message in ws:
                if message.type == aiohttp.WSMsgType.BINARY and message.data[:1] == b"\0" and message.data[1:]:
                    writer.write(message.data[1:])
                    await writer.drain()
            writer.close()

        upstream = asyncio.ensure_future(to_pod())
        while data := await reader.read(65536):
            await ws.send_bytes(b"\0" + data)
        await ws.close()
        upstream.cancel()
        return ws
