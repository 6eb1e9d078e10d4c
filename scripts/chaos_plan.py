"""The chaos run's plan: every job it submits and every kill it makes, all drawn from the seed."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

# (user, group): bob and pan in phusers (4 GPUs), lin in phusers and research (8 GPUs, 4 per user).
SUBMITTERS = [("bob", "phusers"), ("pan", "phusers"), ("lin", "phusers"), ("lin", "research")]
# instance type, replicas: 1, 2 or 4 GPUs per replica, within every quota.
SIZES = [("gpu-1", 1), ("gpu-1", 2), ("gpu-2", 1), ("gpu-2", 2), ("gpu-4", 1)]
VICTIMS = ["scheduler", "worker", "web"]


@dataclass
class PlannedJob:
    index: int
    user: str
    group: str
    instance_type: str
    replicas: int
    command: str
    backoff_limit: int
    kind: str  # ok, fail, flaky, cancel
    cancel_after: float = 0.0
    key: str = ""
    job_id: int | None = None
    submitted_at: float = 0.0


@dataclass
class Kill:
    at: float  # seconds after the first submit
    victim: str
    down: float  # seconds before it is started again


def plan(rng: random.Random, jobs: int, kills: int, window: float) -> tuple[list[PlannedJob], list[Kill]]:
    planned = []
    for i in range(jobs):
        user, group = rng.choice(SUBMITTERS)
        instance_type, replicas = rng.choice(SIZES)
        seconds = round(rng.uniform(0.1, 2.0), 2)
        kind = rng.choices(["ok", "fail", "flaky", "cancel"], weights=[60, 15, 15, 10])[0]
        command, backoff, cancel_after = f"sleep {seconds}", 0, 0.0
        if kind == "fail":  # fails every attempt: retried backoff_limit times, then FAILED
            command, backoff = f"sleep {seconds}; exit 3", rng.choice([0, 1, 2])
        elif kind == "flaky":  # fails its first attempt only
            command, backoff = f'sleep {seconds}; [ "$JOB_ATTEMPT" -ge 2 ] || exit 3', 2
        elif kind == "cancel":  # long enough to be cancelled while it runs, often
            command, cancel_after = f"sleep {seconds + 4}", round(rng.uniform(0.2, 6.0), 2)
        planned.append(PlannedJob(i, user, group, instance_type, replicas, command, backoff, kind, cancel_after,
                                  key=str(uuid.UUID(int=rng.getrandbits(128)))))
    plan_kills = sorted((Kill(round(rng.uniform(2, window), 2), rng.choice(VICTIMS), round(rng.uniform(0.3, 3), 2))
                         for _ in range(kills)), key=lambda k: k.at)
    return planned, plan_kills
