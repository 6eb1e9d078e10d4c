"""The cluster's capacity as the scheduler counts it: the Ready, schedulable nodes that match the pods' node
selector, with their allocatable GPUs, CPU (millicores) and memory (bytes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client

from scheduler.values import Node

from .k8s_api import parse_quantity
from .k8s_manifest import GPU_RESOURCE


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
