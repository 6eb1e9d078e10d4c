"""The nodes as they will be once every terminating job has ended, kept up to date during one decision.

A decision asks, for every job that waits for the jobs it preempted, where it would go once all terminating jobs
are gone (``place_first_fit`` on ``freed_nodes(nodes, terminating)``). ``SoonFree`` answers that without a copy of
every node per question: it keeps its own indexed copy of the nodes (a ``Capacity``) with each terminating job's
placement released, and brings up to date only the nodes that changed since: those the decision charged (its
``Capacity`` records them) and those a new terminating job (a victim of this pass) releases resources on.
Pure: no ORM, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from jobs.rules import RESOURCES

from .placement import Capacity, ReplicaPlacement, Resources

if TYPE_CHECKING:
    from .core import QueuedJob, RunningJob


class SoonFree:
    """``first_fit(job)`` == ``place_first_fit(job, freed_nodes(base.nodes, jobs), use_free=True)`` for the jobs
    given at the start and to ``add`` since, whatever ``base`` was charged with meanwhile."""

    def __init__(self, base: Capacity, jobs: Iterable[RunningJob] = ()):
        self.base = base
        self.view = Capacity(base.nodes)
        base.changed.clear()  # the view is a copy of the nodes as they are now
        self.releases: dict[int, list[tuple[Resources, tuple[int, ...]]]] = {}
        for job in jobs:
            self.add(job)

    def add(self, job: RunningJob) -> None:
        """``job`` terminates: what its placement holds is counted free."""
        for p in job.placement:
            i = self.base.by_name.get(p.node)
            if i is not None:
                self.releases.setdefault(i, []).append((job.request, p.gpu_ids))
                self.base.changed.add(i)

    def first_fit(self, job: QueuedJob) -> list[ReplicaPlacement] | None:
        for i in self.base.changed:
            self._sync(i)
        self.base.changed.clear()
        return self.view.first_fit(job)

    def _sync(self, i: int) -> None:
        """Node ``i`` of the view: the base node as it is now, with the releases on it added."""
        node = self.base.nodes[i]
        free = dict(node.free)
        ids = None if node.free_gpu_ids is None else list(node.free_gpu_ids)
        for request, gpu_ids in self.releases.get(i, ()):
            for r in RESOURCES:
                if r in free:
                    free[r] += request.get(r, 0)
            if ids is not None:
                ids = sorted(set(ids) | set(gpu_ids))
        view = self.view.nodes[i]
        view.free, view.free_gpu_ids = free, ids
        if "gpu" in free:
            self.view._index(i)
