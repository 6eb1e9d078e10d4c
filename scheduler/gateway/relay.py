"""The gateway's two relays, blocking loops on its connection's thread and one more (a thread a direction, so that a
full buffer one way never stalls the other): a command in a pod (the exec WebSocket's channels to and from frames)
and a pod's port (the port-forward's stream to and from raw bytes)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading

from kubernetes import client
from kubernetes.stream import portforward, stream
from websocket import WebSocketException

from jobs import gateway_wire as wire

from .pods import CONTAINER, exit_from_status

log = logging.getLogger(__name__)
V5 = "v5.channel.k8s.io"


def open_exec(core: client.CoreV1Api, namespace: str, name: str, request: dict):
    """The exec WebSocket (a ``WSClient``) of the request's command in the pod's main container."""
    ws = stream(core.connect_get_namespaced_pod_exec, name, namespace, command=request["command"],
                container=CONTAINER, stdin=True, stdout=True, stderr=True, tty=bool(request.get("tty")),
                _preload_content=False, binary=True)
    if request.get("tty"):
        _resize(ws, {"Width": request.get("cols", 80), "Height": request.get("rows", 24)})
    return ws


def _resize(ws, size: dict) -> None:
    width, height = int(size["Width"]), int(size["Height"])
    ws.write_channel(wire.RESIZE, json.dumps({"Width": max(1, min(width, 1000)),
                                              "Height": max(1, min(height, 1000))}).encode())


def _forward_output(ws, sock: socket.socket) -> None:
    for channel in (wire.STDOUT, wire.STDERR):
        data = ws._channels.pop(channel, b"")  # what update() buffered; read_channel() would poll again
        for start in range(0, len(data), wire.MAX_FRAME):
            sock.sendall(wire.frame(channel, data[start:start + wire.MAX_FRAME]))


def _from_web(ws, buffer: bytes, tty: bool) -> bytes:
    """Apply every whole frame of ``buffer`` (stdin, resize); what is left of it."""
    while len(buffer) >= wire.HEADER.size:
        channel, length = wire.HEADER.unpack_from(buffer)
        if length > wire.MAX_FRAME:
            raise ConnectionError("frame too long")
        if len(buffer) < wire.HEADER.size + length:
            break
        data, buffer = buffer[wire.HEADER.size:wire.HEADER.size + length], buffer[wire.HEADER.size + length:]
        if channel == wire.STDIN and data:
            ws.write_channel(wire.STDIN, data)
        elif channel == wire.STDIN and ws.subprotocol == V5:  # an empty one closes stdin (v4 cannot say so)
            ws.close_channel(wire.STDIN)
        elif channel == wire.RESIZE and tty:
            with contextlib.suppress(ValueError, TypeError, KeyError):
                _resize(ws, json.loads(data))
    return buffer


def relay_exec(ws, sock: socket.socket, *, tty: bool) -> int | None:
    """Relay until the command ends (then its status frame, and its exit code returned) or the web goes (None).
    Each direction has its own thread, so that neither waits on a write while the other side waits on it."""
    ws.sock.lock = threading.Lock()  # stdin from one thread, pongs from the other: whole frames each
    web_gone = threading.Event()

    def from_web() -> None:
        buffer = b""
        with contextlib.suppress(OSError, ConnectionError, WebSocketException):
            while chunk := sock.recv(65536):
                buffer = _from_web(ws, buffer + chunk, tty)
        web_gone.set()  # the web's session ended: closing the exec ends the command
        with contextlib.suppress(Exception):
            ws.close()

    reader = threading.Thread(target=from_web, name="gateway-exec-stdin", daemon=True)
    reader.start()
    failure = ""
    try:
        while ws.is_open():
            ws.update(timeout=1.0)
            _forward_output(ws, sock)
    except (WebSocketException, OSError, ValueError, TypeError, AttributeError) as exc:  # closed under update()
        failure = str(exc) if not web_gone.is_set() else ""
        log.info("exec session ended: %s", exc)
    finally:
        with contextlib.suppress(Exception):
            ws.close()
    code, message = None, "the web closed the session"
    if not web_gone.is_set():
        code, message = exit_from_status(ws._channels.pop(wire.STATUS, b""))
        with contextlib.suppress(OSError):
            _forward_output(ws, sock)
            sock.sendall(wire.frame(wire.STATUS, json.dumps({"exit": code, "message": failure or message}).encode()))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # wakes the reader
    reader.join(timeout=10)
    return code


def open_port(core: client.CoreV1Api, namespace: str, name: str, port: int):
    """The port-forward of the pod's ``port``: (its ``PortForward``, the socket of that port's stream)."""
    forward = portforward(core.connect_get_namespaced_pod_portforward, name, namespace, ports=str(port))
    return forward, forward.socket(port)._socket


def relay_port(remote: socket.socket, sock: socket.socket) -> int:
    """Copy bytes both ways, a thread each, until either side closes (then both are shut); the bytes relayed."""
    counts = [0, 0]

    def pump(source: socket.socket, target: socket.socket, index: int) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
                counts[index] += len(data)
        for end in (source, target):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    upstream = threading.Thread(target=pump, args=(sock, remote, 0), name="gateway-port-up", daemon=True)
    upstream.start()
    pump(remote, sock, 1)
    upstream.join(timeout=10)
    remote.close()
    return sum(counts)
