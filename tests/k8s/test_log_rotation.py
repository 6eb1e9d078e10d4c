"""Pod logs as the kubelet really serves them (scheduler/backends/k8s_logs.py): only the current log file, so
lines rotated away before they were read are lost, and the archive says so with one marker line; a restarted
container's new log (no duplicates); and the request budget shared by all pods (k8s_log_pacing.py), with the
clock injected: no sleeps.

The emulator serves logs like the kubelet; rotating a log is dropping its oldest entries.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from jobs.logs import LOST_LINES_PREFIX
from scheduler.backends.k8s_log_pacing import PodQueue, RequestBudget
from scheduler.backends.k8s_logs import LOST_RESTARTS, LOST_ROTATED, LogArchiver, state_path

from .conftest import NAMESPACE
from .test_logs_archive import DEADLINE, make_pod, read

ROOT = Path(__file__).resolve().parents[2]
LOST = LOST_ROTATED.decode()


class Clock:
    """Simulated seconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def archivers(core, clock):
    made = []

    def make(**kwargs) -> LogArchiver:
        options = dict(core=core, namespace=NAMESPACE, container="main", workers=0, refresh_seconds=0, clock=clock)
        archiver = LogArchiver(**{**options, **kwargs})
        made.append(archiver)
        return archiver

    yield make
    for archiver in made:
        archiver.close(wait=True)


@pytest.fixture
def emu(emulator):
    return emulator.emu


def rotate(emu, pod: str, keep: int) -> None:
    """The kubelet rotated the log: only the last ``keep`` lines are in the file it serves now."""
    entries = emu.logs[(NAMESPACE, pod)]
    emu.logs[(NAMESPACE, pod)] = entries[len(entries) - keep:] if keep else []


# --- rotation -------------------------------------------------------------------------------------------


def test_a_log_rotated_between_two_reads_gets_one_marker_and_keeps_every_line_served(emu, core, archivers, tmp_path):
    archiver = archivers()
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "a\nb\n")
    archiver.follow(pod, path, restarts=0)
    emu.emit(NAMESPACE, pod, "c\nd\ne\n")
    rotate(emu, pod, keep=2)  # "c" was in the rotated file, never read
    archiver.follow(pod, path, restarts=0)
    assert read(path) == f"a\nb\n{LOST}d\ne\n"
    emu.emit(NAMESPACE, pod, "f\n")
    rotate(emu, pod, keep=2)  # "e", the last line read, is still served: nothing lost
    archiver.follow(pod, path, restarts=0)
    archiver.follow(pod, path, restarts=0)
    assert read(path) == f"a\nb\n{LOST}d\ne\nf\n"
    assert read(path).count(LOST_LINES_PREFIX) == 1
    assert archiver.stats.gaps == 1


def test_a_log_rotated_to_empty_marks_the_gap_once_lines_come(emu, core, archivers, tmp_path):
    archiver = archivers()
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "a\n")
    archiver.follow(pod, path, restarts=0)
    emu.emit(NAMESPACE, pod, "b\n")
    rotate(emu, pod, keep=0)
    archiver.follow(pod, path, restarts=0)
    assert read(path) == "a\n"
    emu.emit(NAMESPACE, pod, "c\n")
    archiver.follow(pod, path, restarts=0)
    archiver.follow(pod, path, restarts=0)
    assert read(path) == f"a\n{LOST}c\n"


def test_a_new_archiver_still_knows_the_cursor_is_in_the_log(emu, core, archivers, tmp_path):
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "a\n")
    first = archivers()
    first.follow(pod, path, restarts=0)
    first.close(wait=True)
    assert json.loads(state_path(path).read_text())["at_cursor"] is True
    emu.emit(NAMESPACE, pod, "b\nc\n")
    rotate(emu, pod, keep=1)
    archivers().follow(pod, path, restarts=0)  # a scheduler restart
    assert read(path) == f"a\n{LOST}c\n"


def test_a_marker_after_an_unended_line_starts_on_a_line_of_its_own(emu, core, archivers, tmp_path):
    archiver = archivers()
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "a\nprogress")
    assert archiver.finish(pod, path, restarts=0)
    assert read(path) == "a\nprogress"
    emu.emit(NAMESPACE, pod, "\nb\nc\n")
    rotate(emu, pod, keep=1)
    archiver.follow(pod, path, restarts=0)
    assert read(path) == f"a\nprogress\n{LOST}c\n"


# --- restarts -------------------------------------------------------------------------------------------


def test_a_restarted_container_is_no_gap_and_no_line_comes_twice(emu, core, archivers, tmp_path):
    archiver = archivers()
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "first run\n")
    archiver.follow(pod, path, restarts=0)
    emu.emit(NAMESPACE, pod, "died\n")
    emu.restart_container(NAMESPACE, pod)
    emu.emit(NAMESPACE, pod, "second run\n")
    for _ in range(3):
        archiver.follow(pod, path, restarts=1)
    assert read(path) == "first run\ndied\nsecond run\n"
    assert archiver.stats.gaps == 0


def test_instances_that_ended_unread_are_marked(emu, core, archivers, tmp_path):
    archiver = archivers()
    pod = make_pod(core, "job-1-1-0")
    path = tmp_path / "replica-0.log"
    emu.emit(NAMESPACE, pod, "first\n")
    archiver.follow(pod, path, restarts=0)
    emu.emit(NAMESPACE, pod, "lost\n")
    emu.restart_container(NAMESPACE, pod)
    emu.emit(NAMESPACE, pod, "second\n")
    emu.restart_container(NAMESPACE, pod)  # the kubelet keeps the previous instance's log only
    emu.emit(NAMESPACE, pod, "third\n")
    archiver.follow(pod, path, restarts=2)
    archiver.follow(pod, path, restarts=2)
    assert read(path) == f"first\n{LOST_RESTARTS.format(2)}second\nthird\n"
    assert read(path).count(LOST_LINES_PREFIX) == 1


# --- the request budget ----------------------------------------------------------------------------------


def served(emu, since: int) -> list[str]:
    return [path.split("/")[-2] for method, path, _query, _ua in emu.journal[since:]
            if method == "GET" and path.endswith("/log")]


def test_the_budget_holds_with_1000_pods_round_robin_and_recent_output_first(emu, core, archivers, clock, tmp_path):
    rate = 20
    archiver = archivers(refresh_seconds=5, requests_per_second=rate)
    talker = make_pod(core, "job-5000-1-1")  # writes all along; the other pods do not exist (404: nothing to read)
    pods = [talker] + [f"job-{i}-1-1" for i in range(1000)]
    start = len(emu.journal)
    per_second: dict[int, int] = {}
    tick = 1 / 128  # the pacer's wake-ups, exact in binary
    for step in range(10 * 128):  # ten simulated seconds
        if step % 128 == 0:  # a sync round
            emu.emit(NAMESPACE, talker, f"step {step}\n")
            for pod in pods:
                archiver.follow(pod, tmp_path / f"{pod}.log", restarts=0)
        before = emu.log_requests
        archiver.pump()
        second = step // 128
        per_second[second] = per_second.get(second, 0) + emu.log_requests - before
        clock.now += tick
    assert max(per_second.values()) <= rate
    assert sum(per_second.values()) >= 8.5 * rate  # slots on the pacer's ticks: a little under
    order = served(emu, start)
    quiet = [pod for pod in order if pod != talker]
    assert len(quiet) == len(set(quiet))  # round-robin: none twice while others wait
    assert quiet == pods[1:len(quiet) + 1]  # in turn
    assert order.count(talker) == 2  # its output brings it first again once it is due (5 s), before 900 others
    assert archiver.stats.waiting > 0
    assert "step 0\n" in read(tmp_path / f"{talker}.log")


@pytest.mark.fast
def test_finish_never_waits_but_counts_against_polling(clock):
    budget = RequestBudget(10, clock)
    assert budget.try_take()
    assert not budget.try_take()
    budget.force()
    budget.force()
    clock.now += 0.25
    assert not budget.try_take()  # 0.3 s of slots taken
    clock.now += 0.06
    assert budget.try_take()
    assert RequestBudget(0, clock).try_take() and RequestBudget(0, clock).wait_seconds() == 0


@pytest.mark.fast
def test_the_queue_serves_preferred_first_each_class_in_turn_each_pod_once():
    queue = PodQueue()
    for item, hot in [("a", False), ("b", True), ("a", True), ("c", False), ("d", True)]:
        queue.push(item, hot=hot)
    queue.discard("c")
    assert [queue.pop() for _ in range(4)] == ["b", "d", "a", None]


@pytest.mark.fast
def test_the_viewer_shows_the_marker_apart():
    assert LOST.startswith(LOST_LINES_PREFIX) and LOST_RESTARTS.startswith(LOST_LINES_PREFIX)
    script = (ROOT / "static/js/logview/render.js").read_text()
    pattern = re.search(r"var LOST_LINES = /\^(.*)\[\^\\n\]\*\$/m;", script).group(1)
    assert re.match(pattern, LOST) and re.match(pattern, LOST_RESTARTS.format(3))
    assert '"log-lost"' in script
    assert ".log-lost" in (ROOT / "static/css/logview.css").read_text()


def test_the_pacer_starts_pods_waiting_for_the_budget_on_its_own(emu, core, tmp_path):
    archiver = LogArchiver(core=core, namespace=NAMESPACE, container="main", workers=4, refresh_seconds=60,
                           requests_per_second=50)
    try:
        pods = [make_pod(core, f"job-{i}-1-0") for i in range(20)]
        for pod in pods:
            emu.emit(NAMESPACE, pod, f"hello from {pod}\n")
        for pod in pods:  # one sync round: most of them have to wait
            archiver.follow(pod, tmp_path / f"{pod}.log", restarts=0)
        assert archiver.wait_idle(DEADLINE)
        assert all(read(tmp_path / f"{pod}.log") == f"hello from {pod}\n" for pod in pods)
        assert emu.log_requests == len(pods)
    finally:
        archiver.close(wait=True)
