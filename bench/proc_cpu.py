"""CPU seconds of processes, read from /proc, for the benchmarks that report what a run cost beside its wall time."""

from __future__ import annotations

import os
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int | str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes, and the children they have reaped, have spent so far."""
    total = 0.0
    for pid in pids:
        fields = _stat(pid)
        if fields:
            total += sum(int(f) for f in fields[11:15]) / TICKS  # utime stime cutime cstime
    return total


def all_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def session_pids(sid: int) -> list[int]:
    """The live processes of a session (a process started with ``start_new_session`` and what it started)."""
    return [pid for pid in all_pids() if (fields := _stat(pid)) and int(fields[3]) == sid]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def tree_pids(*roots: int) -> list[int]:
    """The ``roots`` and every live process descended from them (a process started in a session of its own, as the
    local backend's launcher and network helpers are, is still a child of the process that started it)."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        if fields := _stat(pid):
            children.setdefault(int(fields[1]), []).append(pid)
    pids, todo = set(), list(roots)  # a set: one root may descend from another
    while todo:
        pid = todo.pop()
        if pid not in pids:
            pids.add(pid)
            todo += children.get(pid, [])
    return sorted(pids)


def machine_busy_seconds() -> float:
    """CPU seconds every CPU of the machine has spent busy so far (user, nice, system, irq, softirq, steal):
    what a run cost whoever spent it, processes that ended unreaped included."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / TICKS


def session_cpu_seconds(sid: int) -> float:
    return cpu_seconds(session_pids(sid))


def label(pid: int) -> str:
    """A short name of a process for a CPU breakdown: its program and first argument that is not an option."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [os.path.basename(a.decode(errors="replace")) for a in argv if a and not a.startswith(b"-")]
    return " ".join(words[:3]) or "?"


def cpu_by_label(pids: list[int]) -> dict[str, float]:
    """CPU seconds so far of each kind of process (``label``), summed over the processes of that kind."""
    return {name: own + reaped for name, (own, reaped) in cpu_split_by_label(pids).items()}


def cpu_split_by_label(pids: list[int]) -> dict[str, tuple[float, float]]:
    """Per kind of process (``label``): CPU seconds its processes spent themselves, and what the children they have
    reaped spent (a replica's sandbox shows under the process that reaped it)."""
    totals: dict[str, tuple[float, float]] = {}
    for pid in pids:
        fields = _stat(pid)
        if not fields:
            continue
        name = label(pid)
        own, reaped = totals.get(name, (0.0, 0.0))
        totals[name] = (own + (int(fields[11]) + int(fields[12])) / TICKS,
                        reaped + (int(fields[13]) + int(fields[14])) / TICKS)
    return totals


def speed_probe(rounds: int = 3) -> float:
    """This machine's speed now: the CPU milliseconds (the least of ``rounds``) a fixed piece of pure Python takes,
    a million additions in a loop. Printed beside a benchmark's figures: the load average says how busy the machine
    is, this how fast its CPU runs for one process (a shared host's varies from day to day by 2x and more). Ratios
    measured in one run (against Slurm, before/after alternating) hold whatever it says; absolute figures compare
    only between runs with a like probe."""
    best = float("inf")
    for _ in range(rounds):
        began = time.process_time()
        total = 0
        for n in range(1_000_000):
            total += n
        best = min(best, time.process_time() - began)
    return best * 1000


def speed_line() -> str:
    return f"machine speed: a million additions in {speed_probe():.0f} ms of CPU (less is faster)"
