"""A tiny client for the API of a server started by the tests."""

import json
import socket
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, body=None, token=None):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Token {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        raw = resp.read().decode()
        return json.loads(raw) if resp.headers.get_content_type() == "application/json" else raw


def probes(targets: dict[str, tuple[str, int]]) -> str:
    """A job's command that tries to connect to each target (name: (host, port)) and prints one line for each,
    "REACHED name" or "refused name", each try with a deadline of its own."""
    return "".join(f'if timeout 10 bash -c "exec 3<>/dev/tcp/{host}/{port}" 2>/dev/null; then echo "REACHED {name}"; '
                   f'else echo "refused {name}"; fi; ' for name, (host, port) in targets.items())


def machine_address() -> str:
    """An address of this machine other than loopback's (where a server on 0.0.0.0 answers too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: the kernel only picks the source address of the route
        except OSError:  # no route out: another loopback address, where such a server answers too
            return "127.0.0.2"
        return s.getsockname()[0]
