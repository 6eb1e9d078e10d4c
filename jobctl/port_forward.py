"""``jobctl port-forward JOB LOCAL:REMOTE [--rank N]``: a local TCP port whose connections reach a port the job
declares, each over its own WebSocket ``/ws/jobs/<id>/portforward/?port=REMOTE`` (binary frames: the bytes)."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import urllib.parse

from .exits import EXIT_API_ERROR, UsageError


def parse_ports(text: str) -> tuple[int, int]:
    local, _, remote = text.partition(":")
    try:
        pair = int(local), int(remote or local)
    except ValueError:
        raise UsageError(f"ports are LOCAL:REMOTE numbers, not {text!r}") from None
    if not all(0 <= p <= 65535 for p in pair) or pair[1] == 0:
        raise UsageError(f"ports are 1 to 65535 (LOCAL 0: any free one), not {text!r}")
    return pair


def forward_url(server: str, job_id: int, port: int, rank: int) -> str:
    parts = urllib.parse.urlsplit(server)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return urllib.parse.urlunsplit((scheme, parts.netloc, f"{parts.path.rstrip('/')}/ws/jobs/{job_id}/portforward/",
                                    urllib.parse.urlencode({"port": port, "rank": rank}), ""))


def cmd_port_forward(api, args, out) -> int:
    local, remote = parse_ports(args.ports)
    listener = socket.create_server(("127.0.0.1", local))
    print(f"Forwarding from 127.0.0.1:{listener.getsockname()[1]} -> job {args.id} port {remote}", flush=True)
    url = forward_url(api.server, args.id, remote, args.rank)
    headers = {"Origin": api.server, **({"Authorization": f"Token {api.token}"} if api.token else {})}
    with listener:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_relay, args=(conn, url, headers, api.timeout), daemon=True).start()
    return EXIT_API_ERROR  # not reached: Ctrl-C ends it (130)


def _relay(conn: socket.socket, url: str, headers: dict, timeout: float) -> None:
    from websockets.sync.client import connect

    with conn:
        try:
            ws = connect(url, additional_headers=headers, open_timeout=timeout, max_size=None)
        except Exception as exc:  # noqa: BLE001 - refused (4404, 4409, ...) or unreachable: said, this one closed
            print(f"jobctl: cannot reach the job's port: {exc}", file=sys.stderr)
            return
        with ws:
            def to_job() -> None:
                with contextlib.suppress(Exception):
                    while data := conn.recv(65536):
                        ws.send(data)
                with contextlib.suppress(Exception):
                    ws.close()

            threading.Thread(target=to_job, daemon=True).start()
            with contextlib.suppress(Exception):
                for message in ws:
                    conn.sendall(message if isinstance(message, bytes) else message.encode())
