"""The state machine and colours, table-driven and pure."""

import pytest

from jobs.choices import TERMINAL_PHASES, Phase
from jobs.state_machine import (
    TRANSITIONS,
    Color,
    InvalidTransition,
    can_transition,
    check_transition,
    color_for,
    holds_resources,
    is_terminal,
)

pytestmark = pytest.mark.fast

P = Phase


@pytest.mark.parametrize("current, target, allowed", [
    (P.SUBMITTED, P.PENDING, True),
    (P.SUBMITTED, P.RUNNING, False),
    (P.PENDING, P.PREPARING, True),
    (P.PENDING, P.RUNNING, False),
    (P.PREPARING, P.RUNNING, True),
    (P.RUNNING, P.SUCCEEDED, True),
    (P.RUNNING, P.PENDING, False),
    (P.RUNNING, P.TERMINATING, True),
    (P.TERMINATING, P.CANCELLED, True),
    (P.TERMINATING, P.PENDING, True),  # preempted training job goes back to the queue
    (P.SUCCEEDED, P.PENDING, False),  # nothing follows success
    (P.CANCELLED, P.PENDING, True),  # restart of a stopped job
    (P.CANCELLED, P.RUNNING, False),
    (P.BACKOFF, P.PENDING, True),
    (P.BACKOFF, P.RUNNING, False),
    (P.UNKNOWN, P.RUNNING, True),
    (P.INADMISSIBLE, P.PENDING, True),
    (P.INADMISSIBLE, P.PREPARING, False),  # admitted only from PENDING
])
def test_transitions(current, target, allowed):
    assert can_transition(current, target) is allowed
    if not allowed:
        with pytest.raises(InvalidTransition):
            check_transition(current, target)


def test_every_phase_has_a_row():
    assert set(TRANSITIONS) == set(Phase)


def test_cancel_reachable_from_every_queued_phase_and_via_terminating_from_active():
    for phase in (P.SUBMITTED, P.PENDING, P.INADMISSIBLE, P.BACKOFF):
        assert can_transition(phase, P.CANCELLED)
    for phase in (P.PREPARING, P.RUNNING, P.UNKNOWN):
        assert can_transition(phase, P.TERMINATING)


def test_terminal_and_resource_groups():
    assert {p for p in Phase if is_terminal(p)} == TERMINAL_PHASES
    assert {p for p in Phase if holds_resources(p)} == {P.PREPARING, P.RUNNING, P.TERMINATING, P.UNKNOWN}


@pytest.mark.parametrize("phase, status, color", [
    (P.PENDING, "Pending", Color.ORANGE),
    (P.SUBMITTED, "Submitted", Color.ORANGE),
    (P.INADMISSIBLE, "Inadmissible", Color.ORANGE),
    (P.PREPARING, "ContainerCreating", Color.GREEN),
    (P.PREPARING, "Pending", Color.ORANGE),  # a pod no node has taken yet
    (P.PREPARING, "ImagePullBackOff", Color.RED),
    (P.RUNNING, "Running", Color.GREEN),
    (P.RUNNING, "CrashLoopBackOff", Color.RED),
    (P.TERMINATING, "Terminating", Color.GREEN),
    (P.SUCCEEDED, "Succeeded", Color.BLUE),
    (P.FAILED, "Fail", Color.RED),
    (P.BACKOFF, "Error", Color.RED),
    (P.CANCELLED, "Cancelled", Color.GREY),
    (P.TIMED_OUT, "TimedOut", Color.GREY),
    (P.PREEMPTED, "Preempted", Color.GREY),
    (P.UNKNOWN, "Unknown", Color.LIGHT_GREY),
])
def test_colors(phase, status, color):
    assert color_for(phase, status) == color
