"""The ports a job declares (``Job.ports``: ``[{"name": "jupyter", "port": 8888}]``), opened at
``/jobs/<id>/ports/<port>/`` on each port's own host (jobs/port_origin.py, jobs/port_proxy.py). Pure: what a
submission's value means, or why it is refused."""

from __future__ import annotations

import re
from typing import Any

PORTS_MAX = 8
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$")  # as a Kubernetes port name: at most 15 characters


def ports_problems(value: Any) -> tuple[list[dict], list[str]]:
    """(the ports, in order, each ``{"name", "port"}``; the messages of what is wrong with ``value``)."""
    if value in (None, ""):
        return [], []
    if not isinstance(value, list):
        return [], ['A list of {"name": ..., "port": ...}.']
    if len(value) > PORTS_MAX:
        return [], [f"At most {PORTS_MAX} ports."]
    ports, errors, names, numbers = [], [], set(), set()
    for i, item in enumerate(value, 1):
        if not isinstance(item, dict) or set(item) - {"name", "port"} or "port" not in item:
            errors.append(f'Port {i}: give {{"name": ..., "port": ...}} (name optional).')
            continue
        port = item["port"]
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            errors.append(f"Port {i}: a port number is 1 to 65535, not {port!r}.")
            continue
        name = item.get("name") or f"port-{port}"
        if not isinstance(name, str) or not NAME.match(name):
            errors.append(f"Port {i}: a name is 1 to 15 lowercase letters, digits and '-' (not at either end), "
                          f"not {name!r}.")
            continue
        if port in numbers:
            errors.append(f"Port {port} is declared twice.")
        elif name in names:
            errors.append(f"The name {name!r} is used twice.")
        numbers.add(port)
        names.add(name)
        ports.append({"name": name, "port": port})
    return (ports, []) if not errors else ([], errors)


def base_url(job_id: int, ports: list[dict]) -> str:
    """JOB_BASE_URL of a job that declares ports: the path of its first port (the same on its own host)."""
    return f"/jobs/{job_id}/ports/{ports[0]['port']}/" if ports else ""
