"""``Capacity.first_fit`` (an overlay of the touched nodes over the indexed ones) places exactly as a first fit on a
fresh copy of every node, freed of the given jobs, would: random placements, charges, reservations and freed sets
from a fixed seed."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from scheduler.capacity_index import SoonFree
from scheduler.core import QueuedJob, RunningJob
from scheduler.placement import Capacity, ReplicaPlacement, freed_nodes, place_first_fit
from scheduler.values import Node

pytestmark = pytest.mark.fast

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _nodes(rng: random.Random) -> list[Node]:
    nodes = []
    for i in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.1:  # does not limit GPUs
            nodes.append(Node(f"n{i}", {"cpu": 16000}, {"cpu": rng.choice([0, 4000, 16000])}, None))
            continue
        gpus = rng.choice([2, 4, 8])
        taken = set(rng.sample(range(gpus), rng.randint(0, gpus)))
        free_ids = [g for g in range(gpus) if g not in taken]
        allocatable = {"gpu": gpus, "cpu": 32000}
        free = {"gpu": len(free_ids), "cpu": rng.choice([0, 8000, 32000])}
        if kind < 0.2:  # does not know its GPU ids
            free_ids = None
        nodes.append(Node(f"n{i}", allocatable, free, free_ids))
    return nodes


def _job(rng: random.Random, n: int) -> QueuedJob:
    return QueuedJob(id=n, name=f"j{n}", group_id=1, user_id=1, priority=0, queued_at=T0,
                     replicas=rng.randint(1, 3), request={"gpu": rng.randint(0, 4), "cpu": rng.choice([0, 2000])})


def _running(rng: random.Random, nodes: list[Node], n: int) -> RunningJob:
    replicas = rng.randint(1, 2)
    gpu = rng.randint(0, 2)
    placement = tuple(ReplicaPlacement(rng.choice(nodes).name if rng.random() < 0.9 else "gone",
                                       tuple(rng.sample(range(8), gpu))) for _ in range(replicas))
    return RunningJob(id=1000 + n, name=f"r{n}", group_id=1, priority=0, preemptible=True, replicas=replicas,
                      request={"gpu": gpu, "cpu": 1000}, admitted_at=T0, placement=placement)


def test_first_fit_matches_a_first_fit_on_freed_copies_of_every_node():
    rng = random.Random(20261126)
    checked = 0
    for _ in range(300):
        capacity = Capacity(_nodes(rng))
        for step in range(15):
            job = _job(rng, step)
            freed = [_running(rng, capacity.nodes, k) for k in range(rng.randint(0, 4))]
            expected = place_first_fit(job, freed_nodes(capacity.nodes, freed), use_free=True)
            before = [(dict(n.free), None if n.free_gpu_ids is None else list(n.free_gpu_ids))
                      for n in capacity.nodes]
            assert capacity.first_fit(job, freed) == expected
            assert [(n.free, n.free_gpu_ids) for n in capacity.nodes] == before  # charges nothing
            checked += expected is not None
            action = rng.random()  # change the nodes as a decision does: admissions and reservations
            if action < 0.5:
                capacity.place(job)
            elif action < 0.7 and expected is not None:
                capacity.reserve(job, expected)
    assert checked > 100  # the random worlds place many jobs, not only refuse them


def test_soon_free_matches_a_first_fit_on_the_nodes_freed_of_every_terminating_job():
    rng = random.Random(6)
    checked = 0
    for _ in range(200):
        capacity = Capacity(_nodes(rng))
        terminating = [_running(rng, capacity.nodes, k) for k in range(rng.randint(0, 3))]
        soon = SoonFree(capacity, terminating)
        for step in range(15):
            job = _job(rng, step)
            expected = place_first_fit(job, freed_nodes(capacity.nodes, terminating), use_free=True)
            assert soon.first_fit(job) == expected
            checked += expected is not None
            action = rng.random()  # admissions, reservations and new victims, in any order, between questions
            if action < 0.4:
                capacity.place(job)
            elif action < 0.6 and expected is not None:
                capacity.reserve(job, expected)
            elif action < 0.8:
                victim = _running(rng, capacity.nodes, 100 + step)
                terminating.append(victim)
                soon.add(victim)
    assert checked > 100
