"""Where replicas go: the nodes' free resources during one decision, and first-fit or best-fit placement on them.

``Capacity`` keeps every node's free resources and an index of the nodes by free GPUs, charged in place: a replica
goes to the node with the fewest free GPUs that holds it (best fit), found without a scan of the nodes.
``place_first_fit`` asks whether a job fits nodes as given (empty, or as they will be once some jobs have ended:
``freed_nodes``); ``Capacity.first_fit`` answers the same on the charged nodes without copying them all (only the
nodes the ended jobs or the replicas touch). Pure: no ORM, no I/O.
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
        self.changed: set[int] = set()  # nodes charged or given back since a reader last cleared it
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
        self.changed.add(i)
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
                    self.changed.add(j)
                    if "gpu" in free:
                        self._index(j)
                self.free_gpu = free_gpu
                return None
            node = self.nodes[i]
            if i not in saved:
                saved[i] = (dict(node.free), None if node.free_gpu_ids is None else list(node.free_gpu_ids))
            placement.append(ReplicaPlacement(node.name, self._charge(i, job.request, None)))
        return placement

    def first_fit(self, job: QueuedJob, freed: Iterable[RunningJob] = ()) -> list[ReplicaPlacement] | None:
        """``place_first_fit(job, freed_nodes(self.nodes, freed), use_free=True)``, without a copy of every node:
        only the nodes ``freed`` release resources on, and those the replicas go to, are copied (an overlay over
        the charged nodes), and the first node that holds a replica is looked up in the index. Charges nothing."""
        overlay: dict[int, tuple[dict[str, int], list[int] | None]] = {}
        for v in freed:
            for p in v.placement:
                i = self.by_name.get(p.node)
                if i is None:
                    continue
                free, ids = self._copy(overlay, i)
                for r in RESOURCES:
                    if r in free:
                        free[r] += v.request.get(r, 0)
                if ids is not None:
                    overlay[i] = (free, sorted(set(ids) | set(p.gpu_ids)))
        held = set(overlay)  # nodes whose base free resources do not tell whether they hold a replica
        placement: list[ReplicaPlacement] = []
        request = job.request
        for _ in range(job.replicas):
            i = self._first_holding(request, held)
            for j in sorted(overlay):
                if i is not None and j >= i:
                    break
                if all(request.get(r, 0) <= overlay[j][0].get(r, request.get(r, 0)) for r in RESOURCES):
                    i = j
                    break
            if i is None:
                return None
            free, ids = self._copy(overlay, i)
            held.add(i)
            for r in RESOURCES:
                if r in free:
                    free[r] -= request.get(r, 0)
            taken: tuple[int, ...] = ()
            if ids is not None:
                taken = tuple(ids[: request.get("gpu", 0)])
                del ids[: request.get("gpu", 0)]
            placement.append(ReplicaPlacement(self.nodes[i].name, taken))
        return placement

    def _copy(self, overlay: dict[int, tuple[dict[str, int], list[int] | None]], i: int
              ) -> tuple[dict[str, int], list[int] | None]:
        if i not in overlay:
            node = self.nodes[i]
            overlay[i] = (dict(node.free), None if node.free_gpu_ids is None else list(node.free_gpu_ids))
        return overlay[i]

    def _first_holding(self, request: Resources, skip: set[int]) -> int | None:
        """The lowest index of a node, not in ``skip``, whose free resources hold ``request``."""
        best: int | None = None
        for free in range(max(request.get("gpu", 0), 0), self.most + 1):
            heap = self.buckets.get(free)
            if not heap:
                continue
            while heap and self.nodes[heap[0]].free["gpu"] != free:  # moved to another bucket since
                heapq.heappop(heap)
            if not heap or (best is not None and heap[0] >= best):
                continue
            if heap[0] not in skip and self._holds(self.nodes[heap[0]], request):
                best = heap[0]
                continue
            for i in sorted(heap):
                if best is not None and i >= best:
                    break
                if i not in skip and self.nodes[i].free["gpu"] == free and self._holds(self.nodes[i], request):
                    best = i
                    break
        for i in self.unlimited:
            if best is not None and i >= best:
                break
            if i not in skip and self._holds(self.nodes[i], request):
                best = i
                break
        return best

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
