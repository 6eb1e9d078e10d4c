"""The simulated backend: configured nodes and GPUs, and replicas that "run" for a given time on a clock.

No process, no pod: a launch records when each replica starts; ``observe`` answers from the clock what a real
backend would report (STARTING until ``start_delay`` has passed, RUNNING until the job's duration has, then EXITED
with code 0; once stopped, EXITED with code 143 after ``stop_delay``). The clock is a callable, so the same
backend serves a virtual clock (``scheduler.simulation.replay``: event to event, no waiting) or the wall clock.

How long a replica runs: ``durations`` (job id → seconds, what a replay knows of every job), else the
``JOBSITE_SIM_SECONDS`` variable of the replica's environment, else ``default_seconds``.

``due(now)`` is what an informer is to the Kubernetes backend: the attempts whose observation changed up to
``now`` since it was last asked, so a replay reconciles only those; ``next_change()`` says when the next one does.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from scheduler.values import LaunchSpec, Node, ReplicaObservation, ReplicaState

from .base import BackendDefaults

DURATION_ENV = "JOBSITE_SIM_SECONDS"
STOPPED_EXIT_CODE = 143  # what a process ended by SIGTERM reports


@dataclass
class _Attempt:
    replicas: int
    started: datetime
    seconds: float
    stopped: datetime | None = None
    cleaned: bool = False


class SimBackend(BackendDefaults):
    name = "sim"

    def __init__(self, nodes: list[tuple[str, int]] | int = 1, gpus_per_node: int = 8, *,
                 clock: Callable[[], datetime], durations: Mapping[int, float] | None = None,
                 default_seconds: float = 60.0, start_delay: float = 0.0, stop_delay: float = 0.0):
        """``nodes``: a count of alike nodes (``sim-0``, ``sim-1``, ... with ``gpus_per_node`` GPUs each) or a
        list of (name, GPUs)."""
        if isinstance(nodes, int):
            nodes = [(f"sim-{i}", gpus_per_node) for i in range(nodes)]
        self._nodes = list(nodes)
        self.clock = clock
        self.durations = durations if durations is not None else {}
        self.default_seconds = default_seconds
        self.start_delay = timedelta(seconds=start_delay)
        self.stop_delay = timedelta(seconds=stop_delay)
        self._attempts: dict[tuple[int, int], _Attempt] = {}
        self._changes: list[tuple[datetime, int, int]] = []  # (when, job, attempt): an observation changes

    # --- the interface -----------------------------------------------------------------------------------------

    def nodes(self) -> list[Node]:
        return [Node(name=name, allocatable={"gpu": gpus}, free={"gpu": gpus}, free_gpu_ids=list(range(gpus)))
                for name, gpus in self._nodes]

    def launch(self, spec: LaunchSpec, *, retries: int | None = None) -> dict:
        now = self.clock()
        seconds = self._seconds(spec)
        self._attempts[(spec.job_id, spec.attempt_number)] = _Attempt(len(spec.replicas), now, seconds)
        running = now + self.start_delay
        if self.start_delay:
            self._change(running, spec.job_id, spec.attempt_number)
        self._change(running + timedelta(seconds=seconds), spec.job_id, spec.attempt_number)
        return {"sim_seconds": seconds}

    def stop(self, *, job_id: int, attempt_number: int, replicas: int, force: bool = False) -> None:
        attempt = self._attempts.get((job_id, attempt_number))
        if attempt is None or attempt.stopped is not None:
            return
        attempt.stopped = self.clock()
        self._change(attempt.stopped + (timedelta(0) if force else self.stop_delay), job_id, attempt_number)

    def stuck_after(self) -> float:
        return max(self.stop_delay.total_seconds() * 2, 1.0)

    def observe(self, *, job_id: int, attempt_number: int, replicas: int) -> list[ReplicaObservation]:
        attempt = self._attempts.get((job_id, attempt_number))
        if attempt is None:  # never launched here (or forgotten): nothing of it exists
            return [ReplicaObservation(rank, ReplicaState.LOST, message="unknown to the simulated backend")
                    for rank in range(replicas)]
        now = self.clock()
        running = attempt.started + self.start_delay
        ends = running + timedelta(seconds=attempt.seconds)
        if attempt.stopped is not None and attempt.stopped < ends:
            gone = attempt.stopped + self.stop_delay
            if now >= gone:
                return [ReplicaObservation(rank, ReplicaState.EXITED, exit_code=STOPPED_EXIT_CODE, finished_at=gone)
                        for rank in range(replicas)]
            return [ReplicaObservation(rank, ReplicaState.RUNNING, status="Terminating", present=True)
                    for rank in range(replicas)]
        if now < running:
            return [ReplicaObservation(rank, ReplicaState.STARTING, status="ContainerCreating", present=True)
                    for rank in range(replicas)]
        if now < ends:
            return [ReplicaObservation(rank, ReplicaState.RUNNING, present=True, started_at=running)
                    for rank in range(replicas)]
        return [ReplicaObservation(rank, ReplicaState.EXITED, exit_code=0, finished_at=ends, started_at=running)
                for rank in range(replicas)]

    def log_path(self, *, job_id: int, attempt_number: int, rank: int) -> Path:
        return Path("/dev/null")  # a simulated replica writes nothing

    def cleanup(self, *, job_id: int, attempt_number: int, replicas: int) -> None:
        self._attempts.pop((job_id, attempt_number), None)

    # --- for a replay ------------------------------------------------------------------------------------------

    def next_change(self) -> datetime | None:
        """When the observation of some attempt changes next (None: none will by itself)."""
        return self._changes[0][0] if self._changes else None

    def due(self, now: datetime) -> set[tuple[int, int]]:
        """(job, attempt) of every attempt whose observation changed up to ``now`` since the last call."""
        found = set()
        while self._changes and self._changes[0][0] <= now:
            _, job_id, number = heapq.heappop(self._changes)
            found.add((job_id, number))
        return found

    def _change(self, when: datetime, job_id: int, attempt_number: int) -> None:
        heapq.heappush(self._changes, (when, job_id, attempt_number))

    def _seconds(self, spec: LaunchSpec) -> float:
        if spec.job_id in self.durations:
            return float(self.durations[spec.job_id])
        for replica in spec.replicas:
            if DURATION_ENV in replica.env:
                return float(replica.env[DURATION_ENV])
        return self.default_seconds
