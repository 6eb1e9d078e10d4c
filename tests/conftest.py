"""Shared fixtures: the demo world (groups, quotas, instance types, users) and a job factory."""

from __future__ import annotations

import _posixsubprocess
import itertools
import os
import socket
import subprocess
import warnings
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import Resource, Role
from jobs.models import Group, GroupQuota, Image, InstanceType, Job, Membership
from jobs.services import job_spec_validate, job_submit

GIB = 1 << 30


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """A test database per pytest process, so runs side by side never drop each other's database."""
    from django.conf import settings

    test = settings.DATABASES["default"].setdefault("TEST", {})
    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        test["NAME"] = f"test_jobsite_{os.getpid()}"


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Notes on the test whether its setup or call failed, for the fixtures' teardown to read."""
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


class ProcessStarted(AssertionError):
    """A test of the fast lane started a process or a server."""


# Every way a process gets started (subprocess, asyncio's subprocesses, multiprocessing, os) and a server listens.
_PROCESS_STARTERS = [
    (subprocess.Popen, "_execute_child"),
    (_posixsubprocess, "fork_exec"),
    *((os, name) for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")),
    (socket.socket, "listen"),
]


@pytest.fixture(autouse=True)
def _fast_starts_no_process(request, monkeypatch):
    """The fast lane (`-m "fast and not slow"`) holds no test that starts a process or a server: a test marked
    `fast` (and not `slow`) that starts one fails, so a module marked fast by mistake is caught, not run slowly."""
    if request.node.get_closest_marker("fast") is None or request.node.get_closest_marker("slow") is not None:
        yield
        return
    started: list[str] = []

    def refuse(owner, name):
        def starter(*args, **kwargs):
            started.append(f"{getattr(owner, '__name__', owner)}.{name}")
            raise ProcessStarted(f"a fast test started a process or a server ({started[-1]}): mark the test "
                                 f"slow, or the module not fast")

        return starter

    for owner, name in _PROCESS_STARTERS:
        if hasattr(owner, name):
            monkeypatch.setattr(owner, name, refuse(owner, name))
    yield
    if started and not request.node.stash.get(_FAILED, False):  # a thread or an `except` swallowed the error above
        pytest.fail(f"a fast test started a process or a server ({', '.join(started)}): mark the test slow, or "
                    f"the module not fast", pytrace=False)


@pytest.fixture(autouse=True)
def _no_dead_connection():
    """Each test starts on a live database connection: one that an earlier test had PostgreSQL end (the recovery
    tests do) is closed first, as Django itself does at the start of every request."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.in_atomic_block and not conn.is_usable():
            conn.close()


@pytest.fixture(autouse=True)
def _live_publisher_drained():
    """A test's live updates are out before its database is emptied: the publisher thread (Redis layer) reads the
    changed jobs on a connection of its own, and a read still under way at the teardown raced its TRUNCATE and went
    on into the next test's setup (seen in CI, with the pool then slow to give connections: jobsite.dbpool)."""
    yield
    from jobs import live_publisher

    if not live_publisher.flush(60):
        warnings.warn("the live publisher did not drain within 60 s", stacklevel=1)


@pytest.fixture(autouse=True)
def _jobsite_settings(settings, tmp_path):
    settings.JOBSITE_SCHEDULER_MODE = "inprocess"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast test users
    settings.JOBSITE_LOCAL_ROOT = tmp_path / "local"
    settings.JOBSITE_LOCAL_USE_NVIDIA_SMI = False
    settings.JOBSITE_LOCAL_GPUS = 8
    from scheduler.backend_factory import get_backend

    get_backend.cache_clear()
    yield
    get_backend.cache_clear()
    _kill_leftover_replicas(tmp_path / "local")
    _stop_launchers(tmp_path)


def _stop_launchers(tmp_path) -> None:
    """The local backends' launchers of a test's roots (``local`` or its own, a few levels down) go with the test:
    they would wait out their idle time."""
    import threading

    from scheduler.backends.launcher import shutdown_all

    for thread in threading.enumerate():  # one being started in the background: stopped too, once it listens
        if thread.name == "launcher-start":
            thread.join(60)
    for depth in range(1, 5):
        for state in tmp_path.glob("/".join(["*"] * depth)):
            if state.name == "state" and any(state.glob("launcher-*.sock")):
                shutdown_all(state)


def _kill_leftover_replicas(root) -> None:
    """A test that ends with a replica still running must not leave its process behind."""
    import signal

    for pid_file in root.glob("state/*/*/*/runner.pid"):
        if (pid_file.parent / "exit_code").exists():
            continue
        try:
            os.killpg(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@pytest.fixture
def make_user(django_user_model):
    counter = itertools.count()

    def make(username: str | None = None, **kw):
        username = username or f"user{next(counter)}"
        return django_user_model.objects.create_user(username=username, password="pw-" + username, **kw)

    return make


@pytest.fixture
def login(client, world):
    """login("bob") → the test client, logged in as bob."""

    def do(username: str):
        client.force_login(world.users[username])
        return client

    return do


@pytest.fixture
def world(db, make_user):
    """The PrimeHub example world: phusers (group 4 GPU, user 4 GPU) with bob, pan, lin; research with lin."""
    users = {name: make_user(name) for name in ["bob", "pan", "lin", "eve"]}
    users["admin"] = make_user("admin", is_superuser=True, is_staff=True)
    image = Image.objects.create(name="base-notebook", url="jupyter/base-notebook:latest")
    types = {
        "cpu-tiny": InstanceType.objects.create(name="cpu-tiny", gpu=0, cpu_millicores=500, memory_bytes=GIB),
        "gpu-1": InstanceType.objects.create(name="gpu-1", gpu=1, cpu_millicores=8000, memory_bytes=32 * GIB),
        "gpu-2": InstanceType.objects.create(name="gpu-2", gpu=2, cpu_millicores=16000, memory_bytes=64 * GIB),
        "gpu-4": InstanceType.objects.create(name="gpu-4", gpu=4, cpu_millicores=32000, memory_bytes=128 * GIB),
    }
    groups = {}
    for name, group_gpu, user_gpu, members in [
        ("phusers", 4, 4, ["bob", "pan", "lin"]),
        ("research", 8, 4, ["lin"]),
    ]:
        group = Group.objects.create(name=name)
        GroupQuota.objects.create(group=group, resource=Resource.GPU, quota=group_gpu, user_quota=user_gpu)
        image.groups.add(group)
        for it in types.values():
            it.groups.add(group)
        for m in members:
            Membership.objects.create(group=group, user=users[m], role=Role.MEMBER)
        groups[name] = group
    # A group nobody of the above belongs to, with its own image.
    other = Group.objects.create(name="other")
    Membership.objects.create(group=other, user=users["eve"], role=Role.ADMIN)
    types["cpu-tiny"].groups.add(other)
    image.groups.add(other)
    groups["other"] = other

    class World:
        pass

    w = World()
    w.users, w.groups, w.types, w.image = users, groups, types, image
    return w


@pytest.fixture
def submit(world):
    """Submit a job through the real validation and service: submit("bob", "gpu-2", command="...")."""
    clock = itertools.count()

    def do(username: str, instance_type: str = "cpu-tiny", group: str = "phusers", **spec) -> Job:
        user = world.users[username]
        data = {"group": group, "image": "base-notebook", "instance_type": instance_type, "command": "true", **spec}
        job = job_submit(user=user, spec=job_spec_validate(user=user, data=data))
        # Distinct submission times, so FIFO order is the order of the calls.
        Job.objects.filter(pk=job.pk).update(queued_at=timezone.now() + timedelta(microseconds=next(clock)))
        job.refresh_from_db()
        return job

    return do


@pytest.fixture
def estimates_each_pass(monkeypatch):
    """The scheduler's estimate memory fresh (read again from this test's database, forgotten after) and each
    pass estimating on its own clock: for tests of what a pass estimates; the least time between two simulations
    (``ESTIMATE_GAP``) has its own tests (tests/scheduler/test_estimate_gap.py)."""
    from scheduler import pass_estimates

    pass_estimates.estimate_memory_reset()
    monkeypatch.setattr(pass_estimates, "ESTIMATE_GAP", timedelta(0))
    yield
    pass_estimates.estimate_memory_reset()
