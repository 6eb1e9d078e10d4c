"""The cluster's capacity as the scheduler counts it: the Ready, schedulable nodes that match the pods' node
selector, with their allocatable GPUs, CPU (millicores) and memory (bytes)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from scheduler.values import Node

from .k8s_api import parse_quantity
from .k8s_manifest import GPU_RESOURCE

log = logging.getLogger(__name__)


def read_nodes(core: client.CoreV1Api, call: Callable[..., Any], node_selector: dict[str, str]) -> list[Node]:
    """List the nodes through ``call`` (the backend's retrying API call) and keep those pods may run on."""
    data = json.loads(call(core.list_node, _preload_content=False).data or b"{}")
    result = []
    for node in data.get("items") or []:
        meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        labels = meta.get("labels") or {}
        if not ready or spec.get("unschedulable") or any(labels.get(k) != v for k, v in node_selector.items()):
            continue
        alloc = status.get("allocatable") or {}
        allocatable = {
            "gpu": int(parse_quantity(alloc.get(GPU_RESOURCE, 0))),
            "cpu": int(parse_quantity(alloc.get("cpu", 0)) * 1000),
            "memory": int(parse_quantity(alloc.get("memory", 0))),
        }
        result.append(Node(name=meta.get("name", ""), allocatable=allocatable, free=dict(allocatable),
                           free_gpu_ids=None))
    return result


# Taints the node lifecycle controller puts on a node whose kubelet stopped reporting (or reports NotReady).
LOST_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")


@dataclass(frozen=True)
class NodeHealth:
    """Every node that exists, and those whose pods cannot be trusted to run (name: why)."""

    known: frozenset[str]
    lost: dict[str, str]


def node_health(items: list[dict]) -> NodeHealth:
    """From the nodes as the API lists them: lost = Ready not True, or tainted unreachable/not-ready."""
    known, lost = set(), {}
    for node in items:
        name = (node.get("metadata") or {}).get("name", "")
        known.add(name)
        ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
        taints = [t.get("key") for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") in LOST_TAINTS]
        if ready is not None and ready.get("status") != "True":
            lost[name] = f"Ready {ready.get('status')}" + (f": {ready['reason']}" if ready.get("reason") else "")
        elif taints:
            lost[name] = f"tainted {taints[0]}"
    return NodeHealth(frozenset(known), lost)


class NodeHealthCache:
    """The nodes' health, read through ``read`` at most once every ``ttl`` seconds (only when a pod looks like
    its node may be lost: most rounds never list the nodes)."""

    def __init__(self, read: Callable[[], list[dict]], ttl: float = 5.0):
        self._read, self._ttl = read, ttl
        self._at = -ttl
        self._health: NodeHealth | None = None
        self._lock = threading.Lock()

    def get(self) -> NodeHealth | None:
        with self._lock:
            if self._health is None or time.monotonic() - self._at >= self._ttl:
                try:
                    self._health = node_health(self._read())
                    self._at = time.monotonic()
                except Exception as exc:  # keep the last read: none means "not known", never "all gone"
                    log.warning("reading the nodes' health failed: %s", exc)
            return self._health


def list_node_items(core: client.CoreV1Api, call: Callable[..., Any]) -> list[dict]:
    return json.loads(call(core.list_node, _preload_content=False).data or b"{}").get("items") or []
