"""The simulated backend and the replay of a workload in virtual time (``manage.py replay``)."""

import importlib.util
import io
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from jobs.choices import Phase
from jobs.models import Job
from scheduler.backends.sim import SimBackend
from scheduler.simulation.history import workload_from_history
from scheduler.simulation.replay import Replay
from scheduler.simulation.workload import WorkloadError, parse_workload
from scheduler.values import LaunchReplica, LaunchSpec, ReplicaState

pytestmark = pytest.mark.fast

T = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)
GENERATOR = Path(__file__).resolve().parents[2] / "bench" / "workloads" / "make_kueue_baseline.py"


def jsonl(*objs) -> list[str]:
    return [json.dumps(o) for o in objs]


def job(submit, group="a", gpus=1, duration=1.0, **kw):
    return {"submit": submit, "group": group, "gpus": gpus, "duration": duration, **kw}


def run(*objs, **kw):
    r = Replay(parse_workload(jsonl(*objs)), **kw)
    return r, r.run()


def spans(replay: Replay) -> dict[int, list[tuple[float, float]]]:
    found: dict[int, list[tuple[float, float]]] = {}
    for a in replay.attempts:
        found.setdefault(a.job, []).append((a.start, a.end))
    return found


# --- the simulated backend ----------------------------------------------------------------------------------


def test_sim_backend_reports_replicas_from_its_clock():
    now = [T]
    sim = SimBackend(2, 4, clock=lambda: now[0], durations={7: 30}, start_delay=2, stop_delay=5)
    assert [(n.name, n.allocatable) for n in sim.nodes()] == [("sim-0", {"gpu": 4}), ("sim-1", {"gpu": 4})]
    spec = LaunchSpec(job_id=7, attempt_id=1, attempt_number=1, command="", image="",
                      replicas=[LaunchReplica(0, "sim-0", (0,), {}), LaunchReplica(1, "sim-1", (0,), {})])
    sim.launch(spec)

    def states():
        return [(o.state, o.exit_code, o.present) for o in sim.observe(job_id=7, attempt_number=1, replicas=2)]

    assert states() == [(ReplicaState.STARTING, None, True)] * 2
    now[0] = T + timedelta(seconds=2)
    assert states() == [(ReplicaState.RUNNING, None, True)] * 2
    now[0] = T + timedelta(seconds=32)
    assert states() == [(ReplicaState.EXITED, 0, False)] * 2
    assert sim.due(now[0]) == {(7, 1)}
    assert sim.next_change() is None

    sim.launch(LaunchSpec(job_id=7, attempt_id=2, attempt_number=2, command="", image="",
                          replicas=[LaunchReplica(0, "sim-0", (0,), {"JOBSITE_SIM_SECONDS": "30"})]))
    now[0] = T + timedelta(seconds=40)
    sim.stop(job_id=7, attempt_number=2, replicas=1)
    assert [o.state for o in sim.observe(job_id=7, attempt_number=2, replicas=1)] == [ReplicaState.RUNNING]
    now[0] = T + timedelta(seconds=45)  # the stop delay later: ended by the signal, nothing left
    assert [(o.state, o.exit_code, o.present) for o in sim.observe(job_id=7, attempt_number=2, replicas=1)] == [
        (ReplicaState.EXITED, 143, False)]


@pytest.mark.django_db
def test_sim_backend_runs_jobs_through_the_real_passes_and_sync(world, submit, clock):
    """The same backend under the scheduler's passes over the database: admitted, running, then succeeded when
    its simulated duration has passed on the clock the scheduler is given."""
    job = submit("bob", "gpu-2", group="phusers")
    now = [T]
    sim = SimBackend(1, 8, clock=lambda: now[0], durations={job.pk: 120})
    clock(now=T, backend=sim)  # admitted; launched after the round's commit
    clock(now=T, backend=sim)  # the next round sees it running
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING
    assert job.current_attempt.node == "sim-0"
    now[0] = T + timedelta(seconds=60)
    clock(now=now[0], backend=sim)
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING
    now[0] = T + timedelta(seconds=120)
    clock(now=now[0], backend=sim)
    job.refresh_from_db()
    assert (job.phase, job.exit_code) == (Phase.SUCCEEDED, 0)
    assert [e.reason for e in job.events.all()][-1] == "Completed"


# --- virtual time -------------------------------------------------------------------------------------------


def test_jobs_run_for_their_durations_on_the_virtual_clock():
    replay, result = run({"cluster": {"nodes": 1, "gpus_per_node": 8}},
                         job(0, gpus=4, duration=10), job(5, gpus=4, duration=3), job(5000, gpus=8, duration=0.5))
    assert spans(replay) == {1: [(0.0, 10.0)], 2: [(5.0, 8.0)], 3: [(5000.0, 5000.5)]}
    assert result.makespan == 5000.5
    assert result.succeeded == 3
    assert result.phases == {Phase.SUCCEEDED: 3}
    assert result.wall_seconds < result.makespan  # no waiting: 5,000 virtual seconds went by in a moment


def test_a_job_waits_for_capacity_until_the_running_one_ends():
    replay, result = run({"cluster": {"nodes": 1, "gpus_per_node": 4}},
                         job(0, gpus=4, duration=10), job(1, gpus=4, duration=5))
    assert spans(replay)[2] == [(10.0, 15.0)]
    assert result.waits == {"a": [0.0, 9.0]}
    assert result.makespan == 15.0


def test_gpu_usage_and_ideal_makespan_of_a_hand_computed_workload():
    # 8 GPUs: 8 busy for 10 s, idle 10 s, 2 busy for 10 s → 100 GPU-seconds over 30 s of 8 GPUs.
    _, result = run({"cluster": {"nodes": 1, "gpus_per_node": 8}},
                    job(0, gpus=8, duration=10), job(20, gpus=2, duration=10))
    assert result.makespan == 30.0
    assert result.useful_gpu_seconds == 100.0
    assert result.usage == pytest.approx(100 / 240)
    assert result.ideal_makespan == pytest.approx(12.5)


def test_replicas_are_placed_on_as_many_nodes():
    replay, _ = run({"cluster": {"nodes": 3, "gpus_per_node": 4}}, job(0, gpus=4, duration=2, replicas=3))
    (attempt,) = replay.attempts
    assert sorted(p.node for p in attempt.placement) == ["sim-0", "sim-1", "sim-2"]
    assert attempt.gpus == 12


# --- quotas, borrowing, preemption --------------------------------------------------------------------------


def test_reclaiming_a_quota_preempts_the_borrower_which_comes_back_and_completes():
    replay, result = run(
        {"groups": {"a": {"quota": 4, "limit": 8}, "b": {"quota": 4}}, "cluster": {"nodes": 1, "gpus_per_node": 8}},
        job(0, "a", gpus=8, duration=10, preemptible=True),  # borrows b's idle half
        job(2, "b", gpus=4, duration=5),  # b wants its quota back
    )
    assert result.preemptions == 1
    assert spans(replay) == {1: [(0.0, 2.0), (7.0, 17.0)], 2: [(2.0, 7.0)]}
    assert result.phases == {Phase.SUCCEEDED: 2}
    assert result.useful_gpu_seconds == 100.0  # the preempted 2 s are not useful work
    assert result.held_gpu_seconds == 116.0


def test_a_trace_never_goes_over_quota_limit_or_capacity():
    rnd = random.Random(5)
    groups = {"a": {"quota": 6, "limit": 12}, "b": {"quota": 6, "limit": 16}, "c": {"quota": 4}}
    lines = [{"groups": groups, "cluster": {"nodes": 2, "gpus_per_node": 8}}]
    for i in range(300):
        group = rnd.choice("abc")
        lines.append(job(round(i * 0.7, 1), group, gpus=rnd.choice([1, 1, 2, 4]), duration=rnd.choice([1, 3, 8]),
                         user=f"{group}{rnd.randint(1, 3)}", priority=rnd.choice([0, 50, 100]),
                         preemptible=group != "c" and rnd.random() < 0.6))
    replay, result = run(*lines)
    assert result.succeeded == 300

    events = []
    for a in replay.attempts:
        events += [(a.order[0], 1, a), (a.order[1], 0, a)]  # in the order they happened
    group_use = {g: 0 for g in groups}
    guaranteed_use = {g: 0 for g in groups}  # of jobs that may not borrow
    node_use: dict[str, set[int]] = {"sim-0": set(), "sim-1": set()}
    for _, starting, a in sorted(events, key=lambda e: e[0]):
        sign = 1 if starting else -1
        group_use[a.group] += sign * a.gpus
        if not a.preemptible:
            guaranteed_use[a.group] += sign * a.gpus
        for p in a.placement:
            ids = set(p.gpu_ids)
            if starting:
                assert not ids & node_use[p.node], f"GPUs {ids & node_use[p.node]} of {p.node} handed out twice"
                node_use[p.node] |= ids
            else:
                node_use[p.node] -= ids
        for g, spec in groups.items():
            assert group_use[g] <= spec.get("limit", spec["quota"])
            assert guaranteed_use[g] <= spec["quota"]
        assert sum(len(ids) for ids in node_use.values()) <= 16
    assert all(u == 0 for u in group_use.values())


def test_a_job_larger_than_any_node_is_inadmissible_and_never_runs():
    _, result = run({"cluster": {"nodes": 2, "gpus_per_node": 4}}, job(0, gpus=6), job(0, gpus=2))
    assert result.inadmissible == 1
    assert result.phases == {Phase.INADMISSIBLE: 1, Phase.SUCCEEDED: 1}


# --- the workload file and the command ----------------------------------------------------------------------


@pytest.mark.parametrize("lines, where, what", [
    (['{"submit": 0, "group": "a", "gpus": 1, "duration": 1}', "{nope"], "line 2", "not JSON"),
    ([json.dumps(job(0)), "", json.dumps({"submit": 1, "group": "a", "duration": 1})], "line 3", "missing 'gpus'"),
    ([json.dumps(job(0, duration=-1))], "line 1", "'duration' must be at least 0"),
    ([json.dumps(job(0, gpus=1.5))], "line 1", "'gpus' must be an integer"),
    ([json.dumps(job(0, colour="red"))], "line 1", "unknown key(s) colour"),
    ([json.dumps(job(0)), json.dumps({"groups": {}})], "line 2", "header"),
    ([json.dumps({"groups": {"a": {"quota": 8, "limit": 4}}})], "line 1", "limit (4) must be at least the quota"),
    (["[1, 2]"], "line 1", "expected a JSON object"),
])
def test_a_bad_line_is_named_with_what_is_wrong(lines, where, what):
    with pytest.raises(WorkloadError) as caught:
        parse_workload(lines)
    assert str(caught.value).startswith(where + ":")
    assert what in str(caught.value)


def test_the_command_refuses_a_bad_workload_with_its_line(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps(job(0)) + "\n" + json.dumps({"submit": "soon", "group": "a", "gpus": 1,
                                                             "duration": 1}) + "\n")
    with pytest.raises(CommandError, match=r"line 2: 'submit' must be a number"):
        call_command("replay", str(path))
    with pytest.raises(CommandError, match="GROUP=GPUS"):
        call_command("replay", str(path), "--quota", "a:4")
    with pytest.raises(CommandError, match="cannot read"):
        call_command("replay", str(tmp_path / "missing.jsonl"))


def test_the_command_prints_the_figures(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(jsonl(
        {"groups": {"a": {"quota": 4}, "b": {"quota": 4}}, "cluster": {"nodes": 1, "gpus_per_node": 8}},
        job(0, "a", gpus=4, duration=10), job(0, "a", gpus=4, duration=10), job(0, "b", gpus=2, duration=4),
    )) + "\n")
    out = io.StringIO()
    call_command("replay", str(path), stdout=out)
    text = out.getvalue()
    assert "wall time (the scheduler's own work):" in text
    assert "jobs/s" in text
    assert "virtual makespan: 20.0 s" in text
    assert "ideal makespan (GPU-seconds 88 / 8 GPUs): 11.0 s" in text
    assert "GPU usage: 55.0 %" in text
    assert "waits per group" in text
    assert "  a       2 jobs  0.00 s / 10.0 s / 10.0 s" in text
    assert "  b       1 jobs  0.00 s / 0.00 s / 0.00 s" in text

    out = io.StringIO()  # a's quota doubled: both its jobs start at once
    call_command("replay", str(path), "--quota", "a=8", "--nodes", "2", stdout=out)
    assert "  a       2 jobs  0.00 s / 0.00 s / 0.00 s" in out.getvalue()
    assert "2 node(s) × 8 GPUs = 16 GPUs" in out.getvalue()
    with pytest.raises(CommandError, match="groups the workload does not have: c"):
        call_command("replay", str(path), "--quota", "c=8")


def test_the_shipped_kueue_baseline_workload():
    spec = importlib.util.spec_from_file_location("make_kueue_baseline", GENERATOR)
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    text = generator.OUT.read_text()
    assert text.splitlines() == generator.lines()  # the committed file is what the generator writes
    workload = parse_workload(text.splitlines())
    assert len(workload.jobs) == 15000 and len(workload.groups) == 30
    assert {(g.quota, g.limit) for g in workload.groups.values()} == {(20, 120)}
    per_class = {}
    for j in workload.jobs:
        per_class.setdefault((j.name, j.gpus, j.duration), 0)
        per_class[(j.name, j.gpus, j.duration)] += 1
    assert per_class == {("small", 1, 0.2): 10500, ("medium", 5, 0.5): 3000, ("large", 20, 1.0): 1500}
    assert all(j.preemptible for j in workload.jobs)


# --- what if: the history under other quotas ----------------------------------------------------------------


def ran(job: Job, *, queued, admitted, started, finished, phase=Phase.SUCCEEDED):
    Job.objects.filter(pk=job.pk).update(phase=phase, queued_at=queued, admitted_at=admitted, started_at=started,
                                         finished_at=finished)


@pytest.mark.django_db
def test_history_becomes_a_workload_of_the_jobs_that_ran(world, submit):
    now = T + timedelta(days=10)
    a = submit("bob", "gpu-2", group="phusers", priority=100)
    b = submit("lin", "gpu-2", group="research", replicas=2, preemptible=True)
    old = submit("pan", "gpu-1", group="phusers")
    waiting = submit("pan", "gpu-1", group="phusers")  # never ran: not part of it
    ran(a, queued=now - timedelta(hours=5), admitted=now - timedelta(hours=5), started=now - timedelta(hours=5),
        finished=now - timedelta(hours=3))
    ran(b, queued=now - timedelta(hours=4), admitted=now - timedelta(hours=2), started=now - timedelta(hours=2),
        finished=now - timedelta(hours=1, minutes=30), phase=Phase.FAILED)
    ran(old, queued=now - timedelta(days=3), admitted=now - timedelta(days=3), started=now - timedelta(days=3),
        finished=now - timedelta(days=3) + timedelta(hours=1))
    Job.objects.filter(pk=waiting.pk).update(queued_at=now - timedelta(hours=1))

    history = workload_from_history(1, now=now)
    w = history.workload
    assert [(j.submit, j.group, j.user, j.gpus, j.replicas, j.duration, j.priority, j.preemptible) for j in w.jobs] == [
        (0.0, "phusers", "bob", 2, 1, 7200.0, 100, False),
        (3600.0, "research", "lin", 2, 2, 1800.0, 50, True),
    ]
    assert (w.groups["phusers"].quota, w.groups["phusers"].user_quota) == (4, 4)
    assert w.groups["research"].quota == 8
    assert w.node_list == [("local", 8)]  # no node recorded yet: the local backend's GPUs
    assert history.observed == {"phusers": [0.0], "research": [7200.0]}


@pytest.mark.django_db
def test_what_if_prints_waits_under_the_actual_and_the_changed_quotas(world, submit):
    now = datetime.now(UTC)
    first = submit("bob", "gpu-4", group="phusers")
    second = submit("pan", "gpu-4", group="phusers")
    start = now - timedelta(hours=3)
    ran(first, queued=start, admitted=start, started=start, finished=start + timedelta(hours=1))
    ran(second, queued=start, admitted=start + timedelta(hours=1), started=start + timedelta(hours=1),
        finished=start + timedelta(hours=2))
    out = io.StringIO()
    call_command("replay", "--from-history", "1", "--quota", "phusers=8", stdout=out)
    text = out.getvalue()
    assert "changed GPU quotas: phusers=8" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("phusers"))
    # as they were: 0 and 1 h; replayed under the quota of 4: the same; under 8: both at once.
    assert row.split()[1:] == ["2", "0.00", "s", "/", "1.0", "h", "/", "1.0", "h",
                               "0.00", "s", "/", "1.0", "h", "/", "1.0", "h",
                               "0.00", "s", "/", "0.00", "s", "/", "0.00", "s"]
    with pytest.raises(CommandError, match="either a WORKLOAD.jsonl file or --from-history"):
        call_command("replay")
