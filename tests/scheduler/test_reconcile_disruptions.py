"""reconcile() for what the cluster does to a job through no fault of its own: disruptions requeue it without
spending its backoff, bounded by ``max_disruptions``; a lost node (also counted) is waited out, then force-stopped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs.choices import Phase
from scheduler.reconcile import RetryOrFail, Stop, Terminate, Timing, Transition, reconcile
from scheduler.values import ReplicaObservation, ReplicaState

from .test_reconcile import job

pytestmark = pytest.mark.fast

S = ReplicaState
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
TIMING = Timing(preparing_timeout=180, node_lost_grace=300, requeue_limit=5, stuck_after=630, max_disruptions=3)
REQUEUED = "requeued (1/3) as a new attempt, its backoff not spent"


def r(rank=0, state=S.RUNNING, **kw) -> ReplicaObservation:
    return ReplicaObservation(rank, state, present=True, **kw)


CASES = [
    ("preempted by the cluster's scheduler, exit 137: requeued, not retried on the backoff", job(),
     [r(0, S.EXITED, exit_code=137, disruption="preempted by the cluster's scheduler")],
     [Terminate(Phase.PENDING, "Disrupted", f"Preempted by the cluster's scheduler: {REQUEUED}")]),
    ("terminated by the kubelet, exit 143, the other rank still running: the attempt requeued whole", job(),
     [r(0, S.EXITED, exit_code=143, disruption="terminated by the kubelet (node shutdown or pressure)"), r(1)],
     [Terminate(Phase.PENDING, "Disrupted", "Rank 0 terminated by the kubelet (node shutdown or pressure): "
                                            + REQUEUED)]),
    ("evicted through the Eviction API, still terminating: requeued at once", job(),
     [r(0, status="Terminating", disruption="evicted through the Eviction API (node drain)")],
     [Terminate(Phase.PENDING, "Disrupted", f"Evicted through the Eviction API (node drain): {REQUEUED}")]),
    ("GPU admission error while preparing: requeued", job(phase=Phase.PREPARING, status="ContainerCreating"),
     [r(0, S.FAILED, status="UnexpectedAdmissionError", reason="UnexpectedAdmissionError",
        disruption="refused by gpu-a at admission (UnexpectedAdmissionError)")],
     [Terminate(Phase.PENDING, "Disrupted", f"Refused by gpu-a at admission (UnexpectedAdmissionError): {REQUEUED}")]),
    ("OutOf<resource>: requeued", job(phase=Phase.PREPARING),
     [r(0, S.FAILED, status="OutOfnvidia.com/gpu", disruption="refused by gpu-a at admission (OutOfnvidia.com/gpu)")],
     [Terminate(Phase.PENDING, "Disrupted", f"Refused by gpu-a at admission (OutOfnvidia.com/gpu): {REQUEUED}")]),
    ("evicted for node memory pressure: requeued, not failed", job(),
     [r(0, S.FAILED, status="Evicted", reason="Evicted", disruption="evicted: node memory pressure")],
     [Terminate(Phase.PENDING, "Disrupted", f"Evicted: node memory pressure: {REQUEUED}")]),
    ("evicted over its own limit (no disruption): fails as before", job(),
     [r(0, S.FAILED, status="Evicted", reason="Evicted", message="exceeds the total limit")],
     [Terminate(Phase.FAILED, "Evicted", "exceeds the total limit", failed_rank=0)]),
    ("taint manager on a lost node: requeued, what is left force-stopped", job(),
     [r(0, S.LOST, status="Unknown", disruption="deleted from a tainted node")],
     [Terminate(Phase.PENDING, "Disrupted", f"Deleted from a tainted node: {REQUEUED}"),
      Stop(force=True, why="node lost")]),
    ("disrupted as often as allowed: FAILED with a clear message", job(disruptions=3),
     [r(0, S.EXITED, exit_code=137, disruption="preempted by the cluster's scheduler")],
     [Terminate(Phase.FAILED, "DisruptionLimitExceeded", "Preempted by the cluster's scheduler; disrupted by the "
                                                        "cluster 4 time(s) (limit 3): giving up")]),
    ("an exit 137 with no DisruptionTarget: the job's own failure, on the backoff", job(),
     [r(0, S.EXITED, exit_code=137)],
     [RetryOrFail(137, "Attempt 1 failed: the command exited with code 137 (killed by SIGKILL)", failed_rank=0)]),
    # --- a dead node: Ready False on a tainted node (observed LOST, present) ---
    ("pod not Ready on an unreachable node: UNKNOWN, its resources held", job(),
     [r(0, S.LOST, status="Unknown", message="node gpu-a is unreachable")],
     [Transition(Phase.UNKNOWN, reason="NodeUnresponsive", message="node gpu-a is unreachable")]),
    ("UNKNOWN within the grace: wait", job(phase=Phase.UNKNOWN, updated_at=NOW - timedelta(seconds=299)),
     [r(0, S.LOST, message="node gpu-a is unreachable")], []),
    ("UNKNOWN past the grace, disrupted as often as allowed: FAILED, force-stopped",
     job(phase=Phase.UNKNOWN, updated_at=NOW - timedelta(seconds=300), disruptions=3),
     [r(0, S.LOST, message="node gpu-a is unreachable")],
     [Terminate(Phase.FAILED, "DisruptionLimitExceeded", "node gpu-a is unreachable; the attempt failed as NodeLost; "
                                                        "disrupted by the cluster 4 time(s) (limit 3): giving up"),
      Stop(force=True, why="node lost")]),
    ("its node deleted: nothing of it left, requeued as NodeLost at once", job(phase=Phase.UNKNOWN),
     [ReplicaObservation(0, S.LOST, message="node gpu-a running pod p is gone", gone=True)],
     [Terminate(Phase.PENDING, "NodeLost", "node gpu-a running pod p is gone; nothing of it is left: the attempt "
                                           "failed as NodeLost, requeued at once"),
      Stop(force=True, why="replica gone")]),
    ("TERMINATING a disrupted attempt, its pod stuck on the lost node: force-stopped",
     job(phase=Phase.TERMINATING, termination_target=Phase.PENDING, terminating_since=NOW, stop_sent="graceful"),
     [r(0, S.LOST, status="Unknown", disruption="deleted from a tainted node")],
     [Stop(force=True, why="node lost")]),
]


@pytest.mark.parametrize("view, seen, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_disruptions(view, seen, expected):
    assert reconcile(view, seen, NOW, TIMING) == expected
