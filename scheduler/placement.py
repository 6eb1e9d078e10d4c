"""Where replicas go: the nodes' free resources during one decision, and first-fit or best-fit placement on them.

``Capacity`` keeps every node's free resources and an index of the nodes by free GPUs, charged in place: a replica
goes to the node with the fewest free GPUs that holds it (best fit), found without a scan of the nodes.
``place_first_fit`` asks whether a job fits nodes as given (empty, or as they will be once some jobs have ended:
``freed_nodes``). Pure: no ORM, no I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jobs.rules import RESOURCES

from .values import Node

if TYPE_CHECKING:
    from .core import QueuedJob, RunningJob

Resources = Mapping[str, int]


@dataclass(frozen=True)
class ReplicaPlacement:
    node: str
    gpu_ids: tuple[int, ...] = ()


def place_first_fit(job: QueuedJob, nodes: list[Node], *, use_free: bool) -> list[ReplicaPlacement] | None:
    """First-fit every replica onto the nodes; None if some replica finds no room. Does not change nodes."""
    room = [dict(n.free if use_free else n.allocatable) for n in nodes]
    gpu_ids = [list(n.free_gpu_ids or []) if use_free else list(range(n.allocatable.get("gpu", 0))) for n in nodes]
    placement: list[ReplicaPlacement] = []
    for _ in range(job.replicas):
        for i, node in enumerate(nodes):
            if all(job.request.get(r, 0) <= room[i].get(r, job.request.get(r, 0)) for r in RESOURCES):
                for r in RESOURCES:
                    if r in room[i]:
                        room[i][r] -= job.request.get(r, 0)
                ids: tuple[int, ...] = ()
                if nodes[i].free_gpu_ids is not None:
                    ids = tuple(gpu_ids[i][: job.request.get("gpu", 0)])
                    del gpu_ids[i][: job.request.get("gpu", 0)]
                placement.append(ReplicaPlacement(node=node.name, gpu_ids=ids))
                break
        else:
            return None
    return placement


class Capacity:
    """The nodes' free resources during one decision, charged in place, with the nodes indexed by free GPUs.

    ``place`` puts each replica on the node with the fewest free GPUs that holds it (best fit; lowest index among
    equals), looked up in the index rather than by a scan, and charges it at once; a job whose last replica finds
    no room gives back what its first ones took. Nodes that do not limit GPUs are tried after the indexed ones.
    """

    def __init__(self, nodes: list[Node]):
        self.nodes = [Node(n.name, dict(n.allocatable), dict(n.free),
                           None if n.free_gpu_ids is None else list(n.free_gpu_ids)) for n in nodes]
        self.by_name = {n.name: i for i, n in enumerate(self.nodes)}
        self.buckets: dict[int, list[int]] = {}  # free GPUs → heap of node indices (entries may be stale)
        self.unlimited = [i for i, n in enumerate(self.nodes) if "gpu" not in n.free]
        self.free_gpu = sum(n.free.get("gpu", 0) for n in self.nodes)
        self.most = 0
        for i, n in enumerate(self.nodes):
            if "gpu" in n.free:
                self._index(i)

    def __bool__(self) -> bool:
        return bool(self.nodes)

    def _index(self, i: int) -> None:
        free = self.nodes[i].free["gpu"]
        heapq.heappush(self.buckets.setdefault(free, []), i)
        self.most = max(self.most, free)

    @staticmethod
    def _holds(node: Node, request: Resources) -> bool:
        return all(request.get(r, 0) <= node.free.get(r, request.get(r, 0)) for r in RESOURCES)

    def _find(self, request: Resources) -> int | None:
        need = request.get("gpu", 0)
        for free in range(max(need, 0), self.most + 1):
            heap = self.buckets.get(free)
            if not heap:
                continue
            while heap and self.nodes[heap[0]].free["gpu"] != free:  # moved to another bucket since
                heapq.heappop(heap)
            if heap and self._holds(self.nodes[heap[0]], request):
                return heap[0]
            for i in sorted(heap):  # the first one lacks CPU or memory: look further in this bucket
                if self.nodes[i].free["gpu"] == free and self._holds(self.nodes[i], request):
                    return i
        for i in self.unlimited:
            if self._holds(self.nodes[i], request):
                return i
        return None

    def _charge(self, i: int, request: Resources, gpu_ids: tuple[int, ...] | None) -> tuple[int, ...]:
        """Take ``request`` off node ``i`` (never below zero where it is only partly free: a reservation); the
        GPU ids taken: ``gpu_ids`` if given, else the first free ones."""
        node = self.nodes[i]
        for r in RESOURCES:
            if r in node.free:
                taken = min(request.get(r, 0), max(node.free[r], 0))
                node.free[r] -= taken
                if r == "gpu":
                    self.free_gpu -= taken
        ids: tuple[int, ...] = ()
        if node.free_gpu_ids is not None:
            if gpu_ids is None:
                ids = tuple(node.free_gpu_ids[: request.get("gpu", 0)])
            else:
                ids = gpu_ids
            taken_ids = set(ids)
            node.free_gpu_ids = [g for g in node.free_gpu_ids if g not in taken_ids]
        if "gpu" in node.free:
            self._index(i)
        return ids

    def place(self, job: QueuedJob) -> list[ReplicaPlacement] | None:
        """Place and charge every replica of ``job``; None (nothing charged) if some replica finds no room."""
        saved: dict[int, tuple[dict[str, int], list[int] | None]] = {}
        free_gpu = self.free_gpu
        placement: list[ReplicaPlacement] = []
        for _ in range(job.replicas):
            i = self._find(job.request)
            if i is None:
                for j, (free, ids) in saved.items():  # give back what the first replicas took
                    self.nodes[j].free, self.nodes[j].free_gpu_ids = free, ids
                    if "gpu" in free:
                        self._index(j)
                self.free_gpu = free_gpu
                return None
            node = self.nodes[i]
            if i not in saved:
                saved[i] = (dict(node.free), None if node.free_gpu_ids is None else list(node.free_gpu_ids))
            placement.append(ReplicaPlacement(node.name, self._charge(i, job.request, None)))
        return placement

    def reserve(self, job: QueuedJob, placement: list[ReplicaPlacement]) -> None:
        """Charge a placement found elsewhere (on the nodes as they will be once some jobs have ended)."""
        for p in placement:
            i = self.by_name.get(p.node)
            if i is not None:
                self._charge(i, job.request, p.gpu_ids)


def freed_nodes(nodes: list[Node], jobs: Iterable[RunningJob]) -> list[Node]:
    """The nodes as they will be once ``jobs`` have released their placements."""
    result = [
        Node(n.name, dict(n.allocatable), dict(n.free), None if n.free_gpu_ids is None else list(n.free_gpu_ids))
        for n in nodes
    ]
    by_name = {n.name: n for n in result}
    for job in jobs:
        for p in job.placement:
            node = by_name.get(p.node)
            if node is None:
                continue
            for r in RESOURCES:
                if r in node.free:
                    node.free[r] += job.request.get(r, 0)
            if node.free_gpu_ids is not None:
                node.free_gpu_ids = sorted(set(node.free_gpu_ids) | set(p.gpu_ids))
    return result
