"""Resource limits of one local replica: a cgroup of its own, and a bound on its working directory.

Standalone (no Django): the supervisor, ``local_runner.py``, imports it as a sibling when run as a script. The
backend (``limits.py``) finds the hierarchies once (``detect``) and hands each supervisor a ``Plan``; the supervisor
creates the replica's cgroup (``ReplicaCgroup``), puts the command into it before its exec, reads after the end
whether the kernel's OOM killer struck, kills whatever is left in it and removes it.

Layout: one parent per installation, ``jobsite-<root id>``, one leaf per replica under it,
``job-<id>-attempt-<n>-replica-<r>``. With cgroup v2 (one hierarchy, ``cgroup.controllers``) the parent lies
beside or under the server's own cgroup, in the nearest one whose ``cgroup.subtree_control`` can enable the
controllers (a cgroup with processes cannot: the "no internal processes" rule), or under JOBSITE_LOCAL_CGROUP_PARENT
(a delegated subtree); with cgroup v1 (a hierarchy per controller) the parent lies under the server's own cgroup
of each hierarchy. A parent is created by the first supervisor that needs it and removed by the last to leave.

What is written (``writes``), Kubernetes' choices for a container with limits equal to its requests:

================  =====================================================  =========================================
limit             cgroup v1                                              cgroup v2
================  =====================================================  =========================================
memory            memory.limit_in_bytes, memory.memsw.limit_in_bytes     memory.max, memory.swap.max = 0,
                  (same: no swap, where swap is accounted),              memory.oom.group = 1 (the OOM killer
                  memory.swappiness = 0                                  takes the whole replica)
CPU               cpu.cfs_period_us = 100000, cpu.cfs_quota_us           cpu.max = "<quota> 100000"
processes         pids.max (threads count too)                           pids.max
================  =====================================================  =========================================

The working directory has no filesystem quota: its files are bounded by RLIMIT_FSIZE (set on the command), and
the whole directory by the supervisor's periodic scan (``DiskWatch``, as the kubelet measures ephemeral storage),
which kills the replica once it is over (reason ``Evicted``).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

CONTROLLERS = ("memory", "cpu", "pids")
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel refuses a smaller quota
MOUNTINFO = "/proc/self/mountinfo"
SELF_CGROUP = "/proc/self/cgroup"
XFSZ_EXIT = 128 + int(signal.SIGXFSZ)  # a process killed for writing a file past RLIMIT_FSIZE
# The file of each controller a probe writes (its own default back), to learn whether the limits can be set.
PROBE = {1: {"memory": ("memory.limit_in_bytes", "-1"), "cpu": ("cpu.cfs_quota_us", "-1"), "pids": ("pids.max", "max")},
         2: {"memory": ("memory.max", "max"), "cpu": ("cpu.max", "max"), "pids": ("pids.max", "max")}}


# --- what a replica gets (pure) ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    memory: int = 0  # bytes; 0: none
    cpu: int = 0  # millicores; 0: none
    pids: int = 0  # processes and threads; 0: none
    disk: int = 0  # bytes of the working directory; 0: none


def limits_for(request: Mapping[str, int], *, pids: int, disk: int) -> Limits:
    """A replica's limits from its instance type's request (cpu in millicores, memory in bytes)."""
    return Limits(memory=max(int(request.get("memory") or 0), 0), cpu=max(int(request.get("cpu") or 0), 0),
                  pids=max(int(pids), 0), disk=max(int(disk), 0))


@dataclass(frozen=True)
class Write:
    controller: str
    file: str
    value: str
    optional: bool = False  # written only where the kernel has the file (swap accounting, memory.oom.group)


def cpu_quota_us(millicores: int) -> int:
    """CFS quota per CPU_PERIOD_US for ``millicores`` (1000: one CPU)."""
    return max(MIN_CPU_QUOTA_US, millicores * CPU_PERIOD_US // 1000)


def writes(version: int, limits: Limits) -> list[Write]:
    """The files of a replica's cgroup and what goes in them, in the order they are written."""
    out: list[Write] = []
    if limits.memory:
        if version == 1:  # the limit first: memsw may not be below it
            out += [Write("memory", "memory.limit_in_bytes", str(limits.memory)),
                    Write("memory", "memory.memsw.limit_in_bytes", str(limits.memory), optional=True),
                    Write("memory", "memory.swappiness", "0", optional=True)]
        else:
            out += [Write("memory", "memory.max", str(limits.memory)),
                    Write("memory", "memory.swap.max", "0", optional=True),
                    Write("memory", "memory.oom.group", "1", optional=True)]
    if limits.cpu:
        quota = cpu_quota_us(limits.cpu)
        out += ([Write("cpu", "cpu.cfs_period_us", str(CPU_PERIOD_US)), Write("cpu", "cpu.cfs_quota_us", str(quota))]
                if version == 1 else [Write("cpu", "cpu.max", f"{quota} {CPU_PERIOD_US}")])
    if limits.pids:
        out.append(Write("pids", "pids.max", str(limits.pids)))
    return out


def leaf_name(job_id: int, attempt_number: int, rank: int) -> str:
    return f"job-{job_id}-attempt-{attempt_number}-replica-{rank}"


def human(n: int) -> str:
    """1073741824 → "1 GiB", 1536 → "1.5 KiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:g} {unit}" if unit == "B" else f"{round(n, 1):g} {unit}"
        n /= 1024
    return str(n)


@dataclass(frozen=True)
class Plan:
    """What a supervisor is told (``--limits JSON``): the limits and where each controller's leaf goes."""

    name: str  # the leaf
    parents: tuple[tuple[str, int, str], ...] = ()  # (controller, version, the installation's parent directory)
    limits: Limits = field(default_factory=Limits)
    disk_check_seconds: float = 10.0
    required: bool = False  # a leaf that cannot be made keeps the command from running
    warning: str = ""  # written at the top of the replica's log (a controller is missing)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Plan:
        d = json.loads(text)
        return cls(name=d["name"], parents=tuple((c, int(v), p) for c, v, p in d["parents"]),
                   limits=Limits(**d["limits"]), disk_check_seconds=float(d["disk_check_seconds"]),
                   required=bool(d["required"]), warning=d["warning"])


# --- the hierarchies of this machine -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    version: int
    point: str  # where it is mounted
    root: str  # the cgroup shown at ``point`` ("/" unless a bind mount or a namespace shows less)
    controllers: tuple[str, ...] = ()  # v1: from its options; v2: read from cgroup.controllers


def _unescape(path: str) -> str:
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def parse_mountinfo(text: str) -> list[Mount]:
    found = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if len(fields) < 5 or len(kind) < 3 or kind[0] not in ("cgroup", "cgroup2"):
            continue
        version = 1 if kind[0] == "cgroup" else 2
        controllers = tuple(o for o in kind[2].split(",") if o in CONTROLLERS) if version == 1 else ()
        found.append(Mount(version, _unescape(fields[4]), _unescape(fields[3]), controllers))
    return found


def parse_self_cgroup(text: str) -> dict[str, str]:
    """Controller → this process's cgroup in its hierarchy ("" for the v2 hierarchy)."""
    found = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for c in parts[1].split(",") if parts[1] else [""]:
                found[c] = parts[2]
    return found


def own_dir(mount: Mount, path: str) -> Path:
    """The directory of cgroup ``path`` under ``mount`` (its top when the cgroup is outside what it shows)."""
    root = mount.root.rstrip("/")
    if path == root or path.startswith(root + "/"):
        return Path(mount.point + path[len(root):]) if path[len(root):] else Path(mount.point)
    return Path(mount.point)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def enable(directory: Path, controllers: Iterable[str]) -> set[str]:
    """Enable ``controllers`` for the children of ``directory`` (v2); the ones enabled afterwards."""
    on = set(_read(directory / "cgroup.subtree_control").split())
    for c in controllers:
        if c not in on:
            try:
                (directory / "cgroup.subtree_control").write_text(f"+{c}")
                on.add(c)
            except OSError:
                pass
    return on & set(controllers)


@dataclass(frozen=True)
class Found:
    parents: tuple[tuple[str, int, str], ...]  # (controller, version, the installation's parent directory)
    missing: tuple[tuple[str, str], ...]  # (controller, why)


def detect(name: str, *, parent: str = "", mountinfo: str = MOUNTINFO, self_cgroup: str = SELF_CGROUP) -> Found:
    """Where this installation's replicas get each controller, each tried for real (a probe leaf written then
    removed); a controller no hierarchy offers, or one this process may not use, is missing, with why."""
    mounts = parse_mountinfo(_read(Path(mountinfo)))
    own = parse_self_cgroup(_read(Path(self_cgroup)))
    parents: list[tuple[str, int, str]] = []
    why: dict[str, str] = {}
    v2 = next((m for m in mounts if m.version == 2), None)
    offered = set(_read(Path(v2.point) / "cgroup.controllers").split()) if v2 else set()
    wanted = [c for c in CONTROLLERS if c in offered]
    if v2 is not None and wanted:
        top = Path(v2.point)
        if parent:
            candidates = [Path(parent)]
        else:  # this process's cgroup, then each above it, as far as the mount shows
            mine = own_dir(v2, own.get("", "/"))
            candidates = [d for d in (mine, *mine.parents) if d == top or top in d.parents]
        best: tuple[Path, set[str]] = (candidates[0], set())
        for base in candidates:
            on = enable(base, wanted)
            if len(on) > len(best[1]):
                best = (base, on)
            if len(on) == len(wanted):
                break
        for c in wanted:
            if c not in best[1]:
                why[c] = f"cgroup v2: cannot enable it in {best[0]}/cgroup.subtree_control (a cgroup holding " \
                         "processes cannot; set JOBSITE_LOCAL_CGROUP_PARENT to a delegated cgroup)"
        usable = [c for c in wanted if c in best[1]]
        for c, problem in (_probe(2, best[0] / name, usable) if usable else {}).items():
            if problem:
                why[c] = problem
            else:
                parents.append((c, 2, str(best[0] / name)))
    for c in CONTROLLERS:
        if c in wanted:
            continue
        mount = next((m for m in mounts if m.version == 1 and c in m.controllers), None)
        if mount is None:
            why[c] = "no cgroup hierarchy of this machine offers it"
            continue
        directory = own_dir(mount, own.get(c, "/")) / name
        if problem := _probe(1, directory, [c])[c]:
            why[c] = problem
        else:
            parents.append((c, 1, str(directory)))
    order = {c: i for i, c in enumerate(CONTROLLERS)}
    return Found(tuple(sorted(parents, key=lambda p: order[p[0]])),
                 tuple((c, why[c]) for c in CONTROLLERS if c in why))


def _probe(version: int, parent: Path, controllers: list[str]) -> dict[str, str]:
    """Controller → "" when a leaf under ``parent`` takes its limits, else why not."""
    probe = ReplicaCgroup(Plan(name=f"probe-{os.getpid()}", parents=tuple((c, version, str(parent))
                                                                        for c in controllers)))
    try:
        probe.create()
    except OSError as exc:
        return dict.fromkeys(controllers, f"cgroup v{version}: cannot create {parent}/{probe.plan.name}: {exc}")
    result = {}
    leaf = probe.dirs()[0]
    for c in controllers:
        file, value = PROBE[version][c]
        try:
            (leaf / file).write_text(value)
            result[c] = ""
        except OSError as exc:
            result[c] = f"cgroup v{version}: cannot write {leaf / file}: {exc}"
    probe.remove()
    return result


# --- one replica's cgroup (the supervisor) ------------------------------------------------------------------------


class ReplicaCgroup:
    """The leaves of one replica: one directory in v2, one per hierarchy in v1."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self._groups: dict[tuple[int, str], list[str]] = {}
        for c, version, parent in plan.parents:
            self._groups.setdefault((version, parent), []).append(c)

    def dirs(self) -> list[Path]:
        return [Path(parent) / self.plan.name for _, parent in self._groups]

    def create(self) -> None:
        """Make the leaves (their parents first, as needed) and write the limits; OSError when one fails."""
        for (version, parent), controllers in self._groups.items():
            leaf = Path(parent) / self.plan.name
            for tries in range(3):  # the last supervisor to leave may remove the parent meanwhile
                try:
                    os.makedirs(parent, exist_ok=True)
                    if version == 2 and (off := set(controllers) - enable(Path(parent), controllers)):
                        raise OSError(f"cannot enable {', '.join(sorted(off))} in {parent}/cgroup.subtree_control")
                    if leaf.exists():  # left by an earlier run of this replica (a relaunch in place)
                        kill(leaf)
                        leaf.rmdir()
                    leaf.mkdir()
                    break
                except FileNotFoundError:
                    if tries == 2:
                        raise
            for w in writes(version, self.plan.limits):
                if w.controller in controllers and not (w.optional and not (leaf / w.file).exists()):
                    (leaf / w.file).write_text(w.value)

    def join(self) -> None:
        """Move the calling process into every leaf (the command, between its fork and its exec)."""
        pid = str(os.getpid()).encode()
        for leaf in self.dirs():
            fd = os.open(leaf / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def oom_killed(self, exit_code: int) -> bool:
        """Whether the kernel's OOM killer ended a process of the replica (v2 memory.events, v1
        memory.oom_control; a v1 kernel before 4.13 counts no kills: its limit reached and the command killed)."""
        for (version, parent), controllers in self._groups.items():
            if "memory" in controllers:
                leaf = Path(parent) / self.plan.name
                text = _read(leaf / ("memory.events" if version == 2 else "memory.oom_control"))
                counts = dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
                if "oom_kill" in counts:
                    return int(counts["oom_kill"]) > 0
                return exit_code == 128 + signal.SIGKILL and int(_read(leaf / "memory.failcnt").strip() or 0) > 0
        return False

    def members(self) -> set[int]:
        """The processes in the leaves (in v1 the same in each hierarchy)."""
        return set().union(*(members(leaf) for leaf in self.dirs()))

    def kill(self, timeout: float = 5.0) -> None:
        """SIGKILL everything left in the leaves, until they are empty or ``timeout`` has passed."""
        for leaf in self.dirs():
            kill(leaf, timeout)

    def remove(self) -> None:
        """Remove the leaves, and their parents when no other replica is left in them."""
        for leaf in self.dirs():
            remove(leaf)


def members(leaf: Path) -> set[int]:
    return {int(p) for p in _read(leaf / "cgroup.procs").split()}


def kill(leaf: Path, timeout: float = 5.0) -> None:
    """SIGKILL every process of the cgroup ``leaf`` (cgroup.kill where the kernel has it), until it is empty."""
    if (leaf / "cgroup.kill").exists():
        try:
            (leaf / "cgroup.kill").write_text("1")
        except OSError:
            pass
    deadline = time.monotonic() + timeout
    while (pids := members(leaf)) and time.monotonic() < deadline:
        fds = {}
        for pid in pids:  # a pidfd first, then still a member: the signal cannot reach a reused pid
            try:
                fds[pid] = os.pidfd_open(pid)
            except OSError:
                continue
        try:
            for pid in members(leaf) & fds.keys():
                try:
                    signal.pidfd_send_signal(fds[pid], signal.SIGKILL)
                except OSError:
                    pass
        finally:
            for fd in fds.values():
                os.close(fd)
        time.sleep(0.01)


def remove(leaf: Path, timeout: float = 2.0) -> None:
    """rmdir ``leaf`` (retried while its last processes are being reaped), then its parent if it is empty."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            leaf.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
    try:
        leaf.parent.rmdir()  # fails while another replica of this installation has a leaf there
    except OSError:
        pass


def prune(parents: Iterable[str], older_than: float = 60.0) -> int:
    """Remove the empty replica cgroups of every installation beside ``parents`` (``jobsite-*``): those a
    supervisor that died could not remove. A leaf is empty only for the moment between its creation and its
    command's entry, or once all of it has ended: one empty and ``older_than`` seconds old has ended. A
    non-empty cgroup cannot be removed. Returns how many went."""
    removed = 0
    for top in {Path(p).parent for p in parents}:
        try:
            installations = [d for d in top.iterdir() if d.name.startswith("jobsite-") and d.is_dir()]
        except OSError:
            continue
        for installation in installations:
            try:
                leaves = [d for d in installation.iterdir() if d.is_dir() and d.name.startswith("job-")]
            except OSError:
                continue
            for leaf in leaves:
                try:
                    old = time.time() - leaf.stat().st_mtime > older_than
                except OSError:
                    continue
                if old and not members(leaf):
                    remove(leaf, timeout=0)
                    removed += 1
            try:
                installation.rmdir()
            except OSError:
                pass
    return removed


# --- the working directory -----------------------------------------------------------------------------------------


def disk_usage(path: Path | str, stop_above: int = 0) -> int:
    """Bytes the files under ``path`` take on disk (allocated blocks, a hard link once), as ``du`` counts them;
    the scan stops early once past ``stop_above`` (when non-zero)."""
    total, seen, stack = 0, set(), [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if st.st_nlink > 1 and not entry.is_dir(follow_symlinks=False):
                        if (st.st_dev, st.st_ino) in seen:
                            continue
                        seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    if stop_above and total > stop_above:
                        return total
        except OSError:
            continue
    return total


class DiskWatch(threading.Thread):
    """Scan ``path`` every ``interval`` seconds (or 10 times as long as the last scan took, so that scanning
    takes at most a tenth of the time); call ``exceeded(used)`` once it is over ``limit``, and end."""

    def __init__(self, path: Path, limit: int, interval: float, exceeded: Callable[[int], None]):
        super().__init__(daemon=True, name="disk-watch")
        self.path, self.limit, self.interval, self.exceeded = path, limit, interval, exceeded
        self.stopped = threading.Event()

    def run(self) -> None:
        delay = self.interval
        while not self.stopped.wait(delay):
            started = time.monotonic()
            used = disk_usage(self.path, self.limit)
            if used > self.limit and not self.stopped.is_set():
                self.exceeded(used)
                return
            delay = max(self.interval, 10 * (time.monotonic() - started))

    def stop(self) -> None:
        self.stopped.set()
        self.join(5.0)
