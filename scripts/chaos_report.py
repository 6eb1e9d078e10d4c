"""What the chaos run finds in the database at the end, and how it prints its figures."""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from datetime import timedelta

from chaos_sampler import TERMINAL_PHASES, Findings, kill_before
from chaos_topology import Killed

# Issue 21's "Done when", printed beside the figures (goals to compare with, not checks that fail the run).
IDLE_TARGET = 30.0  # GPU-seconds held by attempts with nothing running, per kill
STALL_TARGET = 30.0  # seconds a group's queue may stall
WALL_TARGET = 1.3  # the run's wall time against the same run with --kills 0
NEVER_RAN = ("Requeued", "RequeueLimitExceeded")  # outcomes of an attempt requeued because nothing of it started
CLOCK_SLACK = timedelta(seconds=1)


def trail_holes(conn, job_ids: list[int]) -> dict[int, str]:
    """Ended jobs whose events lack what their path requires, or say what did not happen.

    "Started" is written by the sync that first sees a replica running (or already ended), never at the launch:
    an attempt that reached RUNNING or ended by its own exit has exactly one; one never launched, or requeued
    because nothing of it started (it never reached RUNNING), has none; and none is dated before its launch.
    """
    holes: dict[int, str] = {}
    phases = dict(conn.execute("SELECT id, phase FROM jobs_job WHERE id = ANY(%s)", [job_ids]).fetchall())
    reasons: dict[int, list[str]] = defaultdict(list)
    of_attempt: dict[int | None, Counter[str]] = defaultdict(Counter)
    started_at: dict[int | None, object] = {}
    for job_id, attempt_id, reason, at in conn.execute(
            "SELECT job_id, attempt_id, reason, time FROM jobs_jobevent WHERE job_id = ANY(%s) ORDER BY id",
            [job_ids]):
        reasons[job_id].append(reason)
        of_attempt[attempt_id][reason] += 1
        if reason == "Started":
            started_at.setdefault(attempt_id, at)
    attempts: dict[int, list[tuple]] = defaultdict(list)
    for row in conn.execute("SELECT job_id, id, number, launched_at, running_at, outcome FROM jobs_attempt "
                            "WHERE job_id = ANY(%s) ORDER BY number", [job_ids]):
        attempts[row[0]].append(row[1:])
    for job_id, phase in phases.items():
        if phase not in TERMINAL_PHASES:
            continue
        missing, wrong = [], []
        if "Submitted" not in reasons[job_id]:
            missing.append("Submitted")
        for attempt_id, number, launched_at, running_at, outcome in attempts[job_id]:
            events = of_attempt[attempt_id]
            if not events["Admitted"]:
                missing.append(f"Admitted of attempt {number}")
            if (running_at is not None or outcome in ("Completed", "Error")) and not events["Started"]:
                missing.append(f"Started of attempt {number}")
            if events["Started"] > 1:
                wrong.append(f"{events['Started']} Started of attempt {number}")
            if events["Started"] and launched_at is None:
                wrong.append(f"a Started of attempt {number}, never launched")
            elif events["Started"] and running_at is None and outcome in NEVER_RAN:
                wrong.append(f"a Started of attempt {number}, requeued ({outcome}) before it ran")
            elif events["Started"] and started_at[attempt_id] < launched_at - CLOCK_SLACK:
                wrong.append(f"a Started of attempt {number} dated before its launch")
            if outcome == "CancelledByUser" and launched_at is not None and not events["Terminated"]:
                missing.append(f"Terminated of attempt {number} (cancelled while it held resources)")
        if phase == "SUCCEEDED" and "Completed" not in reasons[job_id]:
            missing.append("Completed")
        if phase == "CANCELLED" and "CancelledByUser" not in reasons[job_id]:
            missing.append("CancelledByUser")
        if missing or wrong:
            holes[job_id] = "; ".join([phase] + (["lacks " + ", ".join(missing)] if missing else [])
                                      + (["has " + ", ".join(wrong)] if wrong else []))
    return holes


def overlapping_attempts(conn, job_ids: list[int]) -> dict[int, str]:
    """Jobs with an attempt launched before the previous one had ended."""
    found = {}
    by_job: dict[int, list[tuple]] = defaultdict(list)
    for job_id, number, launched, ended in conn.execute(
            "SELECT job_id, number, launched_at, ended_at FROM jobs_attempt WHERE job_id = ANY(%s) ORDER BY number",
            [job_ids]):
        by_job[job_id].append((number, launched, ended))
    for job_id, rows in by_job.items():
        for (n1, _l1, e1), (n2, l2, _e2) in zip(rows, rows[1:], strict=False):
            if l2 is not None and (e1 is None or l2 < e1):
                found[job_id] = f"attempt {n2} launched before attempt {n1} ended"
    return found


def print_zeros(figures: list[tuple[str, int, dict]]) -> None:
    """The figures that must be 0, with a few examples of each that is not."""
    for name, count, detail in figures:
        shown = "; ".join(f"{k}: {v}" for k, v in list(detail.items())[:5])
        print(f"  {name:<20} {count:>4}" + (f"   e.g. {shown}" if count else ""))


def _after(killed: list[Killed], index: int) -> str:
    return f", after kill {index + 1} ({killed[index].victim} at {killed[index].at:.0f} s)" if index >= 0 else ""


def _goal(met: bool) -> str:
    return "met" if met else "NOT met"


def load() -> str:
    """The machine's load average over 1, 5 and 15 minutes."""
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def print_recovery(found: Findings, killed: list[Killed], wall: float, allowance: float) -> None:
    """What the kills cost: GPU-seconds held by attempts with nothing running, the longest queue stall, the wall
    time, each beside issue 21's goal; then the same per kill."""
    per_kill = [found.idle_of_kill[i] for i in range(len(killed))]
    print(f"  idle GPU-seconds   {found.idle_gpu_seconds:>6.1f}   held by attempts with nothing running (past "
          f"{allowance:g} s from their launch); {found.idle_of_kill[-1]:.1f} before the first kill")
    if killed:
        worst = max(range(len(killed)), key=lambda i: per_kill[i])
        print(f"      per kill: mean {sum(per_kill) / len(killed):.1f}, worst {per_kill[worst]:.1f} (kill {worst + 1}: "
              f"{killed[worst].victim} at {killed[worst].at:.0f} s); goal <= {IDLE_TARGET:g} per kill: "
              f"{_goal(per_kill[worst] <= IDLE_TARGET)}")
    for (job, number), seconds in found.idle_of_attempt.most_common(3):
        print(f"      job {job} attempt {number}: {seconds:.1f} GPU-s held with nothing running"
              + _after(killed, found.idle_after[job, number]))
    stall = found.longest_stall()
    lasted = stall.lasted if stall else 0.0
    print(f"  longest queue stall {lasted:>5.1f} s   {len(found.stalls)} stalls in all; goal <= {STALL_TARGET:g} s: "
          f"{_goal(lasted <= STALL_TARGET)}")
    if stall:
        print(f"      {stall.group}, job {stall.head} at its head from {stall.began:.0f} to {stall.ended:.0f} s"
              + _after(killed, kill_before(killed, stall.began)))
    print(f"  wall time          {wall:>6.0f} s   first submit to every job ended (goal: within {WALL_TARGET:g}x of "
          "the same run with --kills 0)")
    if killed:
        longest: dict[int, float] = defaultdict(float)
        for s in found.stalls:
            i = kill_before(killed, s.began)
            longest[i] = max(longest[i], s.lasted)
        print("  per kill: GPU-seconds held by attempts gone idle after it, longest queue stall begun after it")
        for i, kill in enumerate(killed):
            print(f"    {i + 1:>2}. {kill.victim:<11} at {kill.at:>5.0f} s   {per_kill[i]:>6.1f} GPU-s   "
                  f"{longest.get(i, 0.0):>5.1f} s")
