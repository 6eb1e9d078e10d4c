"""What the chaos run watches while it runs, every half second: what the database says is held and queued, and the
job processes alive on this machine (their JOBSITE_REPLICA marker, read from /proc). From each sample:

overcommit        a node's held GPUs exceed its GPUs, a GPU id is held twice, or processes of two attempts use the
                  same GPU (supervisors excepted: they use no GPU and outlive their command by a moment).
double attempts   processes of two attempts of one job alive together.
idle GPU-seconds  GPU-seconds held by attempts with nothing running: in each sample, the GPUs held (``gpu`` ×
                  ``replicas`` of the current attempt) by every job in a resource phase (PREPARING, RUNNING,
                  TERMINATING, UNKNOWN) none of whose replicas has a live process (any carrying the attempt's marker,
                  supervisors included) and which is past its start allowance (``allowance`` seconds, by the
                  database's clock, after its launch was claimed, or after its admission while it is not launched),
                  times the time since the previous sample. A normal start is not counted; the moment between a
                  command's exit and the scheduler noticing it is, as is all a killed scheduler leaves held.
queue stall       a group's queue is stalled in a sample when its head could be admitted on what is really in use
                  and was not. Its head: the first of its queued jobs (SUBMITTED or PENDING; priority, then
                  submission order) whose requeue delay is over and whose user's quota does not hold it back (the
                  jobs decide() passes over without holding the queue). It could be admitted when its GPUs fit the
                  group's GPU quota, its user's quota and the node's free GPUs, counting as in use only the GPUs of
                  attempts that are not idle as above (GPUs a dead attempt holds in the database are free: the
                  queue waits for nothing real). A stall runs from the first sample in which its group is stalled
                  with that head to the first in which the group is not stalled or has another head (0.5 s
                  resolution). GPUs only: the local node and the demo quotas count nothing else.

What one kill cost: each attempt's stretch of idle samples is put down, whole, to the kill before its first sample
(the latest one sent by then: a scheduler killed right after a launch is charged all its attempt holds until the
next leader sees to it, whatever kills come meanwhile), and each stall to the kill before it began (by time
only: a stall behind an attempt idle since an earlier kill is still put down to the latest).
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import psycopg
from chaos_topology import Killed

RESOURCE_PHASES = ("PREPARING", "RUNNING", "TERMINATING", "UNKNOWN")
QUEUED_PHASES = ("SUBMITTED", "PENDING", "BACKOFF", "INADMISSIBLE")
TERMINAL_PHASES = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT", "PREEMPTED")
MARKER = "JOBSITE_REPLICA"
INTERVAL = 0.5  # seconds between samples


def replica_processes(root_id: str) -> list[tuple[int, int, int, str, str]]:
    """(pid, job, attempt, CUDA_VISIBLE_DEVICES, cmdline) of every live process carrying this installation's marker."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        marker = env.get(MARKER.encode(), b"").decode()
        parts = marker.split(":")
        if len(parts) != 4 or parts[0] != root_id:
            continue
        found.append((int(entry), int(parts[1]), int(parts[2]), env.get(b"CUDA_VISIBLE_DEVICES", b"").decode(),
                      cmdline))
    return found


@dataclass
class Stall:
    group: str
    head: int  # the job at the head of the queue all along
    began: float  # seconds after the first submit
    ended: float = 0.0

    @property
    def lasted(self) -> float:
        return self.ended - self.began


@dataclass
class Findings:
    samples: int = 0
    overcommit: list[str] = field(default_factory=list)
    double: dict[int, str] = field(default_factory=dict)
    idle_gpu_seconds: float = 0.0
    idle_of_attempt: Counter[tuple[int, int]] = field(default_factory=Counter)  # (job, attempt number)
    idle_of_kill: Counter[int] = field(default_factory=Counter)  # index in the kills made; -1: before the first
    idle_after: dict[tuple[int, int], int] = field(default_factory=dict)  # attempt → kill of its first idle stretch
    stalls: list[Stall] = field(default_factory=list)  # ended ones, in order

    def longest_stall(self) -> Stall | None:
        return max(self.stalls, key=lambda s: s.lasted, default=None)


def kill_before(killed: list[Killed], at: float) -> int:
    """Index of the latest kill sent at or before ``at`` (-1: none)."""
    index = -1
    for i, kill in enumerate(list(killed)):
        if kill.at <= at:
            index = i
    return index


class Sampler:
    """Takes the samples (``sample``, every ``INTERVAL`` seconds, from one thread) into ``found``."""

    def __init__(self, conn: psycopg.Connection, root_id: str, gpus: int, killed: list[Killed],
                 allowance: float = 2.0):
        self.conn, self.root_id, self.gpus, self.killed, self.allowance = conn, root_id, gpus, killed, allowance
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ  # the held and the queued from one snapshot
        self.group_names = dict(conn.execute("SELECT id, name FROM jobs_group").fetchall())
        self.quotas: dict[int, tuple[int | None, int | None]] = {
            group: (quota, user_quota) for group, quota, user_quota in conn.execute(
                "SELECT group_id, quota, user_quota FROM jobs_groupquota WHERE resource = 'gpu'")}
        self.found = Findings()
        self.last: float | None = None
        self.open: dict[int, Stall] = {}  # group → its stall going on
        self.idle_since: dict[tuple[int, int], int] = {}  # (job, attempt number) idle → the kill it is put down to

    def sample(self, at: float) -> None:
        """One sample, ``at`` seconds after the first submit."""
        with self.conn.transaction():
            held = self.conn.execute(
                "SELECT j.id, j.group_id, j.user_id, a.number, a.gpu * a.replicas, a.placement, "
                "EXTRACT(EPOCH FROM now() - COALESCE(a.launched_at, a.started_at, a.created_at)) "
                "FROM jobs_job j JOIN jobs_attempt a ON a.id = j.current_attempt_id WHERE j.phase = ANY(%s)",
                [list(RESOURCE_PHASES)]).fetchall()
            queued = self.conn.execute(
                "SELECT id, group_id, user_id, gpu * replicas, retry_at IS NOT NULL AND retry_at > now() "
                "FROM jobs_job WHERE phase = ANY(%s) ORDER BY priority DESC, queued_at, id",
                [["SUBMITTED", "PENDING"]]).fetchall()
        processes = replica_processes(self.root_id)
        found = self.found
        found.samples += 1
        took = INTERVAL if self.last is None else at - self.last
        self.last = at
        self._overcommit(held)
        self._processes(processes)

        alive = {(job, attempt) for _pid, job, attempt, _visible, _cmdline in processes}
        in_use, of_group, of_user = 0, Counter(), Counter()
        idle, idle_since = 0, {}
        for job, group, user, number, gpus, _placement, age in held:
            if (job, number) not in alive and float(age) > self.allowance:
                idle += gpus
                found.idle_of_attempt[job, number] += gpus * took
                cause = idle_since[job, number] = self.idle_since.get((job, number), kill_before(self.killed, at))
                found.idle_of_kill[cause] += gpus * took
                found.idle_after.setdefault((job, number), cause)
            else:
                in_use += gpus
                of_group[group] += gpus
                of_user[group, user] += gpus
        found.idle_gpu_seconds += idle * took
        self.idle_since = idle_since

        heads: dict[int, tuple[int, int]] = {}  # group → (head job, its GPUs)
        for job, group, user, request, delayed in queued:
            user_quota = self.quotas.get(group, (None, None))[1]
            if group in heads or delayed or (user_quota is not None and of_user[group, user] + request > user_quota):
                continue
            heads[group] = (job, request)
        stalled = {}
        for group, (job, request) in heads.items():
            quota = self.quotas.get(group, (None, None))[0]
            if (quota is None or of_group[group] + request <= quota) and in_use + request <= self.gpus:
                stalled[group] = job
        for group in set(self.open) | set(stalled):
            going = self.open.get(group)
            if going and going.head != stalled.get(group):
                going.ended = at
                found.stalls.append(self.open.pop(group))
            if group in stalled and group not in self.open:
                self.open[group] = Stall(self.group_names.get(group, str(group)), stalled[group], at)

    def finish(self) -> None:
        """End the stalls still going at the last sample."""
        for stall in self.open.values():
            stall.ended = self.last or stall.began
            self.found.stalls.append(stall)
        self.open.clear()

    def _overcommit(self, held: list[tuple]) -> None:
        per_node: Counter[str] = Counter()
        holders: dict[tuple[str, int], list[int]] = defaultdict(list)
        for job, _group, _user, _number, _gpus, placement, _age in held:
            for replica in (placement or {}).values():
                node = replica.get("node", "")
                for gpu in replica.get("gpu_ids", []):
                    per_node[node] += 1
                    holders[node, gpu].append(job)
        for node, count in per_node.items():
            if count > self.gpus:
                self.found.overcommit.append(f"node {node}: {count} GPUs held of {self.gpus}")
        for (node, gpu), jobs in holders.items():
            if len(set(jobs)) > 1:
                self.found.overcommit.append(f"GPU {gpu} of {node} held by jobs {sorted(set(jobs))}")

    def _processes(self, processes: list[tuple[int, int, int, str, str]]) -> None:
        """Two attempts of one job alive together; a GPU used by processes of two attempts."""
        attempts_of: dict[int, set[int]] = defaultdict(set)
        users_of_gpu: dict[str, set[tuple[int, int]]] = defaultdict(set)
        for _pid, job, attempt, visible, cmdline in processes:
            attempts_of[job].add(attempt)
            if "local_runner" in cmdline:
                continue
            for gpu in filter(None, visible.split(",")):
                users_of_gpu[gpu].add((job, attempt))
        for job, attempts in attempts_of.items():
            if len(attempts) > 1:
                self.found.double.setdefault(job, f"processes of attempts {sorted(attempts)} alive together")
        for gpu, users in users_of_gpu.items():
            if len(users) > 1:
                self.found.overcommit.append(f"GPU {gpu} used by processes of (job, attempt) {sorted(users)}")
