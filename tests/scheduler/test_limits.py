"""Resource limits of local replicas, the pure parts as tables: limits from an instance type, the cgroup v1 and v2
files and values, the hierarchies read from /proc, the plan a supervisor gets, and how much a directory holds.
test_limits_e2e.py runs real jobs against them."""

import json
import os

import pytest
from django.core.exceptions import ImproperlyConfigured

from scheduler.backends import cgroups, limits
from scheduler.backends.cgroups import Limits, Mount, Plan, Write, limits_for, writes
from scheduler.values import LaunchReplica, LaunchSpec

pytestmark = pytest.mark.fast

GIB, MIB = 1024**3, 1024**2
CPU_TINY = {"gpu": 0, "cpu": 500, "memory": GIB}

# --- limits from a request ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("label, request_, pids, disk, expect", [
    ("cpu-tiny", CPU_TINY, 4096, 50 * GIB, Limits(memory=GIB, cpu=500, pids=4096, disk=50 * GIB)),
    ("gpu-2", {"gpu": 2, "cpu": 16000, "memory": 64 * GIB}, 8192, 0, Limits(memory=64 * GIB, cpu=16000, pids=8192)),
    ("nothing requested: no memory or CPU limit", {}, 0, 0, Limits()),
    ("negative settings mean none", {"memory": -1, "cpu": -5}, -1, -1, Limits()),
])
def test_limits_from_the_request(label, request_, pids, disk, expect):
    assert limits_for(request_, pids=pids, disk=disk) == expect, label


# --- the files of a replica's cgroup --------------------------------------------------------------------------------


@pytest.mark.parametrize("label, version, lim, expect", [
    ("v1: memory without swap, CFS quota of half a CPU, pids", 1, Limits(memory=GIB, cpu=500, pids=64), [
        Write("memory", "memory.limit_in_bytes", str(GIB)),
        Write("memory", "memory.memsw.limit_in_bytes", str(GIB), optional=True),
        Write("memory", "memory.swappiness", "0", optional=True),
        Write("cpu", "cpu.cfs_period_us", "100000"),
        Write("cpu", "cpu.cfs_quota_us", "50000"),
        Write("pids", "pids.max", "64"),
    ]),
    ("v2: memory.max, no swap, the whole replica OOM-killed at once", 2, Limits(memory=GIB, cpu=500, pids=64), [
        Write("memory", "memory.max", str(GIB)),
        Write("memory", "memory.swap.max", "0", optional=True),
        Write("memory", "memory.oom.group", "1", optional=True),
        Write("cpu", "cpu.max", "50000 100000"),
        Write("pids", "pids.max", "64"),
    ]),
    ("v2: several CPUs", 2, Limits(cpu=16000), [Write("cpu", "cpu.max", "1600000 100000")]),
    ("v1: a millicore is the kernel's smallest quota", 1, Limits(cpu=1), [
        Write("cpu", "cpu.cfs_period_us", "100000"), Write("cpu", "cpu.cfs_quota_us", "1000")]),
    ("no limits: nothing written (the disk bound is no cgroup's)", 2, Limits(disk=GIB), []),
])
def test_cgroup_files_and_values(label, version, lim, expect):
    assert writes(version, lim) == expect, label


def test_the_plan_travels_as_json():
    plan = Plan(name=cgroups.leaf_name(7, 2, 1), parents=(("memory", 1, "/sys/fs/cgroup/memory/jobsite-ab"),
                                                          ("pids", 2, "/sys/fs/cgroup/jobsite-ab")),
                limits=Limits(memory=GIB, cpu=500, pids=64, disk=MIB), disk_check_seconds=2.5, required=True,
                warning="no cpu")
    assert plan.name == "job-7-attempt-2-replica-1"
    assert Plan.from_json(plan.to_json()) == plan
    assert json.loads(plan.to_json())["limits"] == {"memory": GIB, "cpu": 500, "pids": 64, "disk": MIB}


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1536, "1.5 KiB"), (GIB, "1 GiB"), (20_000_000, "19.1 MiB")])
def test_sizes_in_messages(n, text):
    assert cgroups.human(n) == text


# --- the hierarchies of a machine -----------------------------------------------------------------------------------

HYBRID = """31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
"""
UNIFIED = "27 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
# A container shown only its own cgroup of the host's hierarchy, under a path with a space.
BOUND = "50 40 0:30 /kubepods/pod1 /sys/fs/cgroup/my\\040memory ro,relatime - cgroup cgroup rw,memory\n"


@pytest.mark.parametrize("label, text, expect", [
    ("v1 controllers and a v2 mount without them (this machine's kind)", HYBRID, [
        Mount(1, "/sys/fs/cgroup/cpu,cpuacct", "/", ("cpu",)), Mount(1, "/sys/fs/cgroup/memory", "/", ("memory",)),
        Mount(1, "/sys/fs/cgroup/pids", "/", ("pids",)), Mount(1, "/sys/fs/cgroup/systemd", "/", ()),
        Mount(2, "/sys/fs/cgroup/unified", "/", ())]),
    ("a modern host: cgroup v2 only", UNIFIED, [Mount(2, "/sys/fs/cgroup", "/", ())]),
    ("a bind mount of a sub-cgroup", BOUND, [Mount(1, "/sys/fs/cgroup/my memory", "/kubepods/pod1", ("memory",))]),
])
def test_mounts_from_mountinfo(label, text, expect):
    assert cgroups.parse_mountinfo(text) == expect, label


def test_own_cgroups_from_proc_self_cgroup():
    text = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/f37\n2:cpu,cpuacct:/a b\n0::/\n"
    assert cgroups.parse_self_cgroup(text) == {"name=systemd": "/", "pids": "/", "memory": "/process_api/f37",
                                               "cpu": "/a b", "cpuacct": "/a b", "": "/"}


@pytest.mark.parametrize("label, mount, path, expect", [
    ("the root", Mount(2, "/sys/fs/cgroup", "/"), "/", "/sys/fs/cgroup"),
    ("a service", Mount(2, "/sys/fs/cgroup", "/"), "/system.slice/jobsite.service",
     "/sys/fs/cgroup/system.slice/jobsite.service"),
    ("a mount of a sub-cgroup", Mount(1, "/mnt/m", "/kubepods/pod1"), "/kubepods/pod1/c1", "/mnt/m/c1"),
    ("the mount's own root", Mount(1, "/mnt/m", "/kubepods/pod1"), "/kubepods/pod1", "/mnt/m"),
    ("outside what the mount shows: its top", Mount(1, "/mnt/m", "/kubepods/pod1"), "/kubepods/pod10", "/mnt/m"),
])
def test_own_directory(label, mount, path, expect):
    assert str(cgroups.own_dir(mount, path)) == expect, label


# --- a replica's cgroup on a fake v2 tree (files, not the kernel's) -----------------------------------------------


def test_a_v2_leaf_gets_its_limits_and_its_parent_the_controllers(tmp_path):
    parent = tmp_path / "jobsite-ab"
    plan = Plan(name="job-1-attempt-1-replica-0", parents=tuple((c, 2, str(parent)) for c in cgroups.CONTROLLERS),
                limits=Limits(memory=GIB, cpu=2500, pids=100))
    group = cgroups.ReplicaCgroup(plan)
    group.create()
    leaf = parent / plan.name
    assert group.dirs() == [leaf]
    assert {f.name: f.read_text() for f in leaf.iterdir()} == {
        "memory.max": str(GIB), "cpu.max": "250000 100000", "pids.max": "100"}  # no swap file: not written
    assert (parent / "cgroup.subtree_control").read_text() == "+pids"  # one write per controller (a file here)


@pytest.mark.parametrize("label, version, files, code, expect", [
    ("v2: memory.events counts a kill", 2, {"memory.events": "low 0\nhigh 0\nmax 41\noom 1\noom_kill 1\n"}, 137,
     True),
    ("v2: the limit reached, reclaimed, no kill", 2, {"memory.events": "max 41\noom 0\noom_kill 0\n"}, 1, False),
    ("v1: memory.oom_control (4.13+)", 1, {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"},
     0, True),
    ("v1 before 4.13: its limit reached and killed by SIGKILL", 1,
     {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n", "memory.failcnt": "12\n"}, 137, True),
    ("v1 before 4.13: its limit reached, exited by itself", 1,
     {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n", "memory.failcnt": "12\n"}, 1, False),
])
def test_oom_kills_as_each_version_counts_them(tmp_path, label, version, files, code, expect):
    leaf = tmp_path / "leaf"
    leaf.mkdir()
    for name, text in files.items():
        (leaf / name).write_text(text)
    group = cgroups.ReplicaCgroup(Plan(name="leaf", parents=(("memory", version, str(tmp_path)),)))
    assert group.oom_killed(code) is expect, label


# --- the working directory ------------------------------------------------------------------------------------------


def test_disk_usage_counts_blocks_once_per_file_and_stops_early(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("one", "a/two", "a/b/three"):
        (tmp_path / name).write_bytes(b"x" * MIB)
    os.link(tmp_path / "one", tmp_path / "a" / "one-again")  # a hard link: once
    (tmp_path / "sparse").write_bytes(b"")
    os.truncate(tmp_path / "sparse", 100 * MIB)  # a hole takes no block
    os.symlink("/usr", tmp_path / "usr")  # not followed
    used = cgroups.disk_usage(tmp_path)
    assert 3 * MIB <= used < 3 * MIB + 256 * 1024
    assert MIB < cgroups.disk_usage(tmp_path, stop_above=MIB) < used


# --- the setting ----------------------------------------------------------------------------------------------------


def test_an_unknown_mode_is_refused(settings):
    settings.JOBSITE_LOCAL_LIMITS = "maybe"
    with pytest.raises(ImproperlyConfigured, match="must be one of auto, require, off, not 'maybe'"):
        limits.resolve("ab")


def spec(**request) -> LaunchSpec:
    return LaunchSpec(job_id=7, attempt_id=1, attempt_number=2, command="true", image="", request=request,
                      replicas=[LaunchReplica(rank=0, node="", gpu_ids=(), env={})])


def test_off_gives_the_supervisor_nothing(settings):
    settings.JOBSITE_LOCAL_LIMITS = "off"
    assert limits.resolve("ab").runner_options(spec(**CPU_TINY), 0) == []


def test_what_a_supervisor_is_given(settings):
    settings.JOBSITE_LOCAL_PIDS_MAX, settings.JOBSITE_LOCAL_DISK_BYTES = 100, 2 * GIB
    settings.JOBSITE_LOCAL_DISK_CHECK_SECONDS = 3
    found = cgroups.Found(parents=(("memory", 1, "/m/jobsite-ab"), ("pids", 1, "/p/jobsite-ab")),
                          missing=(("cpu", "no cgroup hierarchy of this machine offers it"),))
    limiter = limits.Limiter("auto", found)
    option, text = limiter.runner_options(spec(**CPU_TINY), 1)
    assert option == "--limits"
    assert Plan.from_json(text) == Plan(
        name="job-7-attempt-2-replica-1", parents=found.parents, limits=Limits(memory=GIB, cpu=500, pids=100,
                                                                               disk=2 * GIB),
        disk_check_seconds=3.0, required=False, warning=limiter.warning)
    assert limiter.warning.startswith("the cgroup controller(s) cpu cannot be used (cpu: no cgroup hierarchy of "
                                      "this machine offers it), so jobs run without a CPU quota.")
