"""Write Kueue's baseline scheduling scenario as a jobsite workload (JSON Lines for ``manage.py replay``).

    .venv/bin/python bench/workloads/make_kueue_baseline.py            # → bench/workloads/kueue_baseline.jsonl
    .venv/bin/python bench/workloads/make_kueue_baseline.py --out /tmp/w.jsonl --nodes 5 --gpus-per-node 120

The scenario (Kueue's scheduler performance test, "baseline"): 5 cohorts of 6 queues, each queue with a nominal
quota of 20 and a borrowing limit of 100 within its cohort; per queue 350 small workloads (1 unit, 200 ms, created
every 100 ms), 100 medium (5 units, 500 ms, every 500 ms) and 50 large (20 units, 1 s, every 1.2 s), priorities
rising with size, preemption of lower priorities within a queue and reclaim within the cohort. 15,000 workloads.

In jobsite's words: each queue is a group (``c<cohort>-q<queue>``) with a GPU quota of 20 and a limit of 120 (its
quota plus the borrowing limit of 100); a group borrows idle GPUs beyond its quota with preemptible jobs, which are
preempted first when another group reclaims its quota, and a higher-priority job of a group may preempt its
lower-priority preemptible ones: every job here is preemptible. jobsite has no cohorts: a group borrows from the
whole cluster, so the 5 cohorts are kept in the names only. Priorities: small low (0), medium normal (50), large
high (100). The units are GPUs.

The cluster: Kueue's baseline runs without nodes (quota only, no kube-scheduler), its capacity the sum of the
nominal quotas, 600. Here 30 nodes of 20 GPUs, 600 GPUs: the same capacity, and a large job (20 GPUs, one replica)
needs a whole node, so placement is part of the test.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COHORTS, QUEUES_PER_COHORT, QUOTA, BORROWING = 5, 6, 20, 100
# name, count per queue, GPUs, run time (s), creation interval (s), priority
CLASSES = [("small", 350, 1, 0.2, 0.1, 0), ("medium", 100, 5, 0.5, 0.5, 50), ("large", 50, 20, 1.0, 1.2, 100)]
NODES, GPUS_PER_NODE = 30, 20
OUT = Path(__file__).with_name("kueue_baseline.jsonl")


def lines(nodes: int = NODES, gpus_per_node: int = GPUS_PER_NODE) -> list[str]:
    groups = [f"c{c}-q{q}" for c in range(1, COHORTS + 1) for q in range(1, QUEUES_PER_COHORT + 1)]
    header = {"groups": {g: {"quota": QUOTA, "limit": QUOTA + BORROWING} for g in groups},
              "cluster": {"nodes": nodes, "gpus_per_node": gpus_per_node}, "defaults": {"preemptible": True}}
    jobs = []
    for g in groups:
        for name, count, gpus, seconds, every, priority in CLASSES:
            for i in range(count):
                submit = round(i * every, 3)
                jobs.append((submit, g, name, {"submit": submit, "group": g, "user": g, "gpus": gpus,
                                               "duration": seconds, "priority": priority, "name": name}))
    jobs.sort(key=lambda j: j[:3])
    dump = lambda obj: json.dumps(obj, separators=(",", ":"))  # noqa: E731
    return [dump(header)] + [dump(j[3]) for j in jobs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--gpus-per-node", type=int, default=GPUS_PER_NODE)
    args = parser.parse_args()
    text = "\n".join(lines(args.nodes, args.gpus_per_node)) + "\n"
    args.out.write_text(text)
    print(f"{args.out}: {text.count(chr(10)) - 1:,} jobs, {len(text.encode()):,} bytes")


if __name__ == "__main__":
    main()
