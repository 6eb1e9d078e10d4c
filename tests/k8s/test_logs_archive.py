"""The incremental pod log archiver (scheduler/backends/k8s_logs.py) against the emulator's pod log endpoint.

The emulator serves logs as the kubelet does (timestamps, sinceTime to the second, limitBytes); its counters
``log_requests`` and ``log_bytes_served`` show what each round cost.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client

from scheduler.backends.k8s_log_lines import format_timestamp, parse_timestamp
from scheduler.backends.k8s_logs import LogArchiver, state_path

from .conftest import NAMESPACE, wait_for
from .emulator import log_timestamp

DEADLINE = 30.0  # generous: a busy 2-core machine
LOG = r"/pods/[^/]+/log$"


def make_pod(core: client.CoreV1Api, name: str) -> str:
    core.create_namespaced_pod(NAMESPACE, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
    return name


def lines(prefix: str, n: int, width: int = 0) -> str:
    return "".join(f"{prefix} {i}{'.' * width}\n" for i in range(n))


@pytest.fixture
def archivers(core):
    made = []

    def make(**kwargs) -> LogArchiver:
        options = dict(core=core, namespace=NAMESPACE, container="main", workers=4, refresh_seconds=0,
                       backoff_seconds=0.05)
        archiver = LogArchiver(**{**options, **kwargs})
        made.append(archiver)
        return archiver

    yield make
    for archiver in made:  # before the emulator stops
        archiver.close(wait=True)


@pytest.fixture
def archiver(archivers) -> LogArchiver:
    return archivers()


@pytest.fixture
def emu(emulator):
    return emulator.emu


def read(path) -> str:
    return path.read_text() if path.exists() else ""


def follow_until(archiver: LogArchiver, pod: str, path, expected: str, **kwargs) -> None:
    """Call follow (as the sync loop does) until the archive holds ``expected``."""

    def done():
        archiver.follow(pod, path, **kwargs)
        return read(path) == expected

    try:
        wait_for(done, timeout=DEADLINE, what="the archive")
    except AssertionError:
        raise AssertionError(f"archive {read(path)!r} != {expected!r}") from None


def one_round(archiver: LogArchiver, pod: str, path, **kwargs) -> None:
    archiver.follow(pod, path, **kwargs)
    assert archiver.wait_idle(DEADLINE)


# --- the emulator's log endpoint --------------------------------------------------------------------------


def test_the_emulator_serves_logs_like_the_kubelet(emulator, emu, core):
    pod = make_pod(core, "job-1-1-0")
    start = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    emu.emit(NAMESPACE, pod, "a\nb\n", at=start, step_ns=500_000_000)  # 12:00:00.0, 12:00:00.5
    emu.emit(NAMESPACE, pod, "c\n", at=start + timedelta(seconds=2))
    read_log = core.read_namespaced_pod_log
    assert read_log(pod, NAMESPACE) == "a\nb\nc\n"
    assert read_log(pod, NAMESPACE, timestamps=True).splitlines() == [
        "2024-05-01T12:00:00.000000000Z a", "2024-05-01T12:00:00.500000000Z b", "2024-05-01T12:00:02.000000000Z c"]
    assert read_log(pod, NAMESPACE, tail_lines=2) == "b\nc\n"
    assert read_log(pod, NAMESPACE, limit_bytes=3) == "a\nb"
    served = emu.log_bytes_served
    api = core.api_client
    url = api.param_serialize("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/log",
                              query_params=[("sinceTime", "2024-05-01T12:00:01Z")])[1]
    assert api.call_api("GET", url).read() == b"c\n"
    assert emu.log_bytes_served == served + 2
    assert emu.log_requests == 5
    emu.logs[(NAMESPACE, pod)] = "plain\n"  # a plain str: every line at one old instant
    assert read_log(pod, NAMESPACE, timestamps=True) == "2000-01-01T00:00:00.000000000Z plain\n"
    with pytest.raises(client.ApiException) as missing:
        read_log(pod, NAMESPACE, previous=True)
    assert missing.value.status == 400
    emu.restart_container(NAMESPACE, pod)
    emu.emit(NAMESPACE, pod, "after\n")
    assert read_log(pod, NAMESPACE, previous=True) == "plain\n"
    assert read_log(pod, NAMESPACE) == "after\n"


def test_timestamps_parse_and_format():
    assert parse_timestamp(b"2024-05-01T12:00:00.5Z") == parse_timestamp(b"2024-05-01T14:00:00.500000000+02:00")
    assert parse_timestamp(b"2024-05-01T12:00:00Z") % 10**9 == 0
    assert parse_timestamp(b"hello") is None
    ns = parse_timestamp(b"2024-05-01T12:00:00.000000123Z")
    assert format_timestamp(ns) == "2024-05-01T12:00:00.000000123Z"
    assert format_timestamp(ns, fraction=False) == "2024-05-01T12:00:00Z"


# --- incremental ------------------------------------------------------------------------------------------


def test_a_growing_log_is_archived_incrementally(emu, core, archiver, tmp_path):
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "job-1" / "attempt-1" / "replica-0.log"
    a = lines("epoch", 2000, width=60)  # about 140 KB, written over the last 20 s
    emu.emit(NAMESPACE, pod, a, at=datetime.now(UTC) - timedelta(seconds=60), step_ns=10_000_000)
    one_round(archiver, pod, path)
    assert read(path) == a
    assert json.loads(state_path(path).read_text())["count"] == 1

    served, requests = emu.log_bytes_served, emu.log_requests
    b = lines("more", 5)
    emu.emit(NAMESPACE, pod, b)
    one_round(archiver, pod, path)
    assert read(path) == a + b
    assert emu.log_requests == requests + 1
    new = emu.log_bytes_served - served
    # The new lines with their timestamps, and those of A's last second (about 100 lines): not A again.
    assert len(b) < new < len(b) + 31 * 5 + 101 * (31 + 70)
    assert new < len(a) / 10

    served = emu.log_bytes_served
    one_round(archiver, pod, path)  # nothing new: the cost of B's second only
    assert read(path) == a + b
    assert emu.log_bytes_served - served <= len(b) + 31 * 5
    assert archiver.stats.bytes_received == emu.log_bytes_served
    assert archiver.stats.requests == emu.log_requests == requests + 2
    assert archiver.stats.errors == 0


def test_follow_refreshes_a_pod_at_most_once_per_refresh(emu, core, archivers, tmp_path):
    archiver = archivers(refresh_seconds=3600)
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "one\n")
    one_round(archiver, pod, path)
    emu.emit(NAMESPACE, pod, "two\n")
    for _ in range(100):
        archiver.follow(pod, path)
    assert archiver.wait_idle(DEADLINE)
    assert emu.log_requests == 1 and read(path) == "one\n"
    assert archiver.finish(pod, path)  # finish does not wait for the refresh
    assert read(path) == "one\ntwo\n"


def test_lines_with_identical_timestamps_are_neither_lost_nor_duplicated(emu, core, archiver, tmp_path):
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    moment = datetime.now(UTC).replace(microsecond=250_000)
    first = emu.emit(NAMESPACE, pod, "x\ny\nx\n", at=moment, step_ns=0)
    assert len({ts for ts, _line in first}) == 1
    one_round(archiver, pod, path)
    assert read(path) == "x\ny\nx\n"
    emu.emit(NAMESPACE, pod, "x\nz\n", at=moment, step_ns=0)  # more lines at the very same instant
    one_round(archiver, pod, path)
    assert read(path) == "x\ny\nx\nx\nz\n"
    emu.emit(NAMESPACE, pod, "later\n", at=moment + timedelta(milliseconds=1))
    one_round(archiver, pod, path)
    one_round(archiver, pod, path)
    assert read(path) == "x\ny\nx\nx\nz\nlater\n"


def test_identical_timestamps_beyond_the_byte_bound(emu, core, archivers, tmp_path):
    # 200 lines of one instant, 300 bytes a request: the bound grows until the answers get past them.
    archiver = archivers(limit_bytes=300)
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    text = lines("same", 200)
    emu.emit(NAMESPACE, pod, text, at=datetime.now(UTC), step_ns=0)
    follow_until(archiver, pod, path, text)
    tail = lines("next", 50)
    emu.emit(NAMESPACE, pod, tail)
    follow_until(archiver, pod, path, text + tail)
    assert archiver.stats.errors == 0


def test_a_log_line_over_the_largest_bound_is_left_out(emu, core, archivers, tmp_path):
    archiver = archivers(limit_bytes=100, max_limit_bytes=400)
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    moment = datetime.now(UTC).replace(microsecond=0)
    emu.emit(NAMESPACE, pod, "before\n" + "#" * 1000 + "\nsame second\n", at=moment)
    emu.emit(NAMESPACE, pod, "after\n", at=moment + timedelta(seconds=1))
    assert archiver.finish(pod, path)
    # The API starts at a second at best: the rest of the second of the overlong line is lost.
    second = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert read(path) == f"before\n[jobsite: log output left out: over 400 bytes at {second}]\nafter\n"


def test_a_last_line_without_newline_waits_for_its_end_until_finish(emu, core, archiver, tmp_path):
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "x\nprogress 10%")  # a line the runtime has not finished
    one_round(archiver, pod, path)
    assert read(path) == "x\n"  # left for later: it may grow
    [(ts, _line)] = emu.emit(NAMESPACE, pod, " 100%\n")
    one_round(archiver, pod, path)
    # The kubelet gives a partial entry and the rest as one line, the rest with its own timestamp.
    assert read(path) == f"x\nprogress 10%{log_timestamp(ts)}  100%\n"

    emu.emit(NAMESPACE, pod, "bye")  # the process ends without a newline
    assert archiver.finish(pod, path)
    assert read(path).endswith("100%\nbye")
    emu.restart_container(NAMESPACE, pod)
    emu.emit(NAMESPACE, pod, "again\n")
    one_round(archiver, pod, path)
    assert read(path).endswith("100%\nbye\nagain\n")  # on a line of its own


def test_plain_str_logs_of_the_other_tests_still_archive(emu, core, archiver, tmp_path):
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    for text in ["a\n", "a\nb\n", "b\n"]:  # the last: rotated
        emu.logs[(NAMESPACE, pod)] = text
        one_round(archiver, pod, path)
    assert read(path) == "a\nb\n"


def test_a_restarted_container_keeps_what_its_previous_instance_wrote_last(emu, core, archiver, tmp_path):
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "first run\n")
    one_round(archiver, pod, path, restarts=0)
    emu.emit(NAMESPACE, pod, "Traceback: died\n")  # not archived yet when the container restarts
    emu.restart_container(NAMESPACE, pod)
    emu.emit(NAMESPACE, pod, "second run\n")
    one_round(archiver, pod, path, restarts=1)
    assert read(path) == "first run\nTraceback: died\nsecond run\n"
    one_round(archiver, pod, path, restarts=1)
    assert read(path) == "first run\nTraceback: died\nsecond run\n"
    assert json.loads(state_path(path).read_text())["restarts"] == 1


# --- cold starts ------------------------------------------------------------------------------------------


def test_a_new_archiver_goes_on_from_the_cursor_file(emu, core, archivers, tmp_path):
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    moment = datetime.now(UTC).replace(microsecond=0)
    emu.emit(NAMESPACE, pod, "a\nb\n", at=moment, step_ns=0)
    first = archivers()
    one_round(first, pod, path)
    first.close(wait=True)
    emu.emit(NAMESPACE, pod, "b\nc\n", at=moment, step_ns=0)  # the same instant again
    emu.emit(NAMESPACE, pod, "d\n")

    second = archivers()  # a scheduler restart: nothing in memory
    one_round(second, pod, path)
    assert read(path) == "a\nb\nb\nc\nd\n"
    second.close(wait=True)

    # A crash after an append, before its cursor was saved: the bytes past the recorded size go, then come again.
    emu.emit(NAMESPACE, pod, "e\n")
    with open(path, "ab") as f:
        f.write(b"e\n")
    third = archivers()
    one_round(third, pod, path)
    assert read(path) == "a\nb\nb\nc\nd\ne\n"


def test_an_archive_without_cursor_is_adopted(emu, core, archiver, tmp_path):
    # Written by the former full-copy archiver: its content is the log so far, without timestamps.
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "x\nx\n")
    path.write_text("x\nx\n")
    emu.emit(NAMESPACE, pod, "x\ny\n")
    one_round(archiver, pod, path)
    assert read(path) == "x\nx\nx\ny\n"
    one_round(archiver, pod, path)
    assert read(path) == "x\nx\nx\ny\n"


def test_an_archive_longer_than_a_rotated_log_is_adopted_at_its_last_line(emu, core, archiver, tmp_path):
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    path.write_text("a\nb\n")
    emu.emit(NAMESPACE, pod, "b\nc\n")  # "a" was rotated away
    one_round(archiver, pod, path)
    assert read(path) == "a\nb\nc\n"


# --- failures ---------------------------------------------------------------------------------------------


def test_follow_never_waits_for_a_failing_log_api(emu, core, archiver, tmp_path):
    pods = [make_pod(core, f"job-{i}-1-0") for i in range(60)]
    for pod in pods:
        emu.emit(NAMESPACE, pod, f"hello from {pod}\n")
    failure = emu.fail("GET", LOG, 503, times=10**9)
    paths = {pod: tmp_path / f"{pod}.log" for pod in pods}

    started = time.monotonic()
    for pod in pods:
        archiver.follow(pod, paths[pod])
    assert time.monotonic() - started < 0.5
    wait_for(lambda: archiver.stats.errors >= 60, timeout=DEADLINE, what="every pod tried")
    started = time.monotonic()
    for _ in range(5):  # further rounds while it still fails
        for pod in pods:
            archiver.follow(pod, paths[pod])
    assert time.monotonic() - started < 0.5
    assert not any(path.exists() for path in paths.values())

    failure.times = 0  # the API recovers
    requests = emu.log_requests

    def all_archived():
        for pod in pods:
            archiver.follow(pod, paths[pod])
        return all(read(paths[pod]) == f"hello from {pod}\n" for pod in pods)

    wait_for(all_archived, timeout=DEADLINE, what="every log archived")
    assert emu.log_requests - requests >= 60


def test_429_waits_for_its_retry_after(emu, core, archiver, tmp_path):
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "busy\n")
    emu.fail("GET", LOG, 429, times=1, headers={"Retry-After": "2"})
    one_round(archiver, pod, path)
    refused = time.monotonic()
    assert archiver.stats.errors == 1 and not path.exists()
    while time.monotonic() - refused < 1.8:  # followed in a busy loop: no request before its Retry-After
        archiver.follow(pod, path)
        assert emu.log_requests == 1
    follow_until(archiver, pod, path, "busy\n")  # then one (the count after it races the next refresh)
    assert time.monotonic() - refused >= 1.9


def test_finish_copies_what_remains(emu, core, archivers, tmp_path):
    archiver = archivers(limit_bytes=1000, refresh_seconds=3600)
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "start\n")
    one_round(archiver, pod, path)
    rest = lines("step", 300)  # several bounded requests
    emu.emit(NAMESPACE, pod, rest)
    requests = emu.log_requests
    assert archiver.finish(pod, path)
    assert read(path) == "start\n" + rest
    assert emu.log_requests - requests > 3
    assert archiver.finish(pod, path)  # nothing more: the same
    assert read(path) == "start\n" + rest


def test_finish_reports_a_failing_api_and_a_missing_pod(emu, core, archiver, tmp_path):
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "last words\n")
    emu.fail("GET", LOG, 500, times=1)
    assert not archiver.finish(pod, path)  # one try: the caller decides when to try again
    assert archiver.finish(pod, path)
    assert read(path) == "last words\n"
    assert archiver.finish("job-404-1-0", tmp_path / "gone.log")  # nothing to read
    assert not (tmp_path / "gone.log").exists()


def test_forget_and_close(emu, core, archiver, tmp_path):
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "one\n")
    one_round(archiver, pod, path)
    archiver.forget(pod)
    emu.emit(NAMESPACE, pod, "two\n")
    one_round(archiver, pod, path)  # from the cursor file
    assert read(path) == "one\ntwo\n"
    archiver.close()
    requests = emu.log_requests
    archiver.follow(pod, path)  # a no-op once closed
    assert emu.log_requests == requests
