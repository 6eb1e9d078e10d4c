"""The gateway's TCP server: one thread a connection; a ticket, the pod's checks, then a relay (the protocol: this
package's docstring). Every session is logged (who asked is the web's to record: it writes the job's event)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from jobs import gateway_wire as wire

from . import relay
from .pods import Refused, pod_open

log = logging.getLogger(__name__)


@dataclass
class Nonces:
    """Tickets already used, kept as long as they would be valid: a ticket opens one session only."""

    seconds: float = wire.TICKET_SECONDS
    seen: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def first_use(self, nonce: str) -> bool:
        now = time.monotonic()
        with self.lock:
            for key in [k for k, until in self.seen.items() if until < now]:
                del self.seen[key]
            if nonce in self.seen:
                return False
            self.seen[nonce] = now + self.seconds + 5
            return True


class Handler(socketserver.BaseRequestHandler):
    server: GatewayServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(wire.TICKET_SECONDS)
        try:
            request = self.server.ticket(wire.read_line(sock).strip().decode("ascii", "replace"))
            name = pod_open(self.server.core, self.server.namespace, installation=self.server.installation,
                            job=request["job"], attempt=request["attempt"], rank=request["rank"])
        except wire.TicketRefused as exc:
            return self._refuse(403, f"ticket refused: {exc}")
        except Refused as exc:
            return self._refuse(exc.status, exc.message)
        except (OSError, ConnectionError):
            return
        sock.settimeout(None)
        what = f"port {request['port']}" if "port" in request else "a command"
        started = time.monotonic()
        try:
            if "port" in request:
                forward, remote = relay.open_port(self.server.core, self.server.namespace, name, request["port"])
                self._reply({"ok": True})
                relay.relay_port(remote, sock)
                forward.close()
                outcome = ""
            else:
                ws = relay.open_exec(self.server.core, self.server.namespace, name, request)
                self._reply({"ok": True})
                code = relay.relay_exec(ws, sock, tty=bool(request.get("tty")))
                outcome = f", exit code {code}" if code is not None else ""
        except (ApiException, OSError) as exc:
            return self._refuse(502, f"the cluster's API refused {what} of pod {name}: {exc}")
        log.info("%s of pod %s: %.0f s%s", what, name, time.monotonic() - started, outcome)

    def _reply(self, body: dict) -> None:
        with contextlib.suppress(OSError):
            self.request.sendall(json.dumps(body).encode() + b"\n")

    def _refuse(self, status: int, message: str) -> None:
        log.info("refused (%d): %s", status, message)
        self._reply({"error": message, "status": status})


class GatewayServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], *, api_client: client.ApiClient | None = None,
                 namespace: str | None = None, installation: str | None = None):
        from scheduler.backends.k8s_api import load_api_client

        self.core = client.CoreV1Api(api_client or load_api_client())
        self.namespace = namespace or settings.JOBSITE_K8S_NAMESPACE
        self.installation = installation or settings.JOBSITE_INSTALLATION_ID
        self.nonces = Nonces()
        super().__init__(address, Handler)

    def ticket(self, ticket: str) -> dict:
        request = wire.ticket_read(ticket)
        if request.get("installation") != self.installation:
            raise wire.TicketRefused("the ticket is another installation's")
        if not self.nonces.first_use(str(request.get("nonce", ""))):
            raise wire.TicketRefused("the ticket was already used")
        return request

    @property
    def port(self) -> int:
        return self.server_address[1]

    def start(self) -> GatewayServer:
        threading.Thread(target=self.serve_forever, name="jobsite-gateway", daemon=True).start()
        return self
