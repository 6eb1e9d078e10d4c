"""The job state machine: which phase may follow which, and the colour a status is shown in.

Pure: no database, no Django models. Every status write goes through ``jobs.services.job_transition``,
which asks ``check_transition`` first.
"""

from __future__ import annotations

from .choices import RESOURCE_PHASES, TERMINAL_PHASES, Phase

P = Phase

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    P.SUBMITTED: frozenset({P.PENDING, P.INADMISSIBLE, P.CANCELLED}),
    P.INADMISSIBLE: frozenset({P.INADMISSIBLE, P.PENDING, P.CANCELLED}),  # its reason is kept current
    P.PENDING: frozenset({P.PENDING, P.INADMISSIBLE, P.PREPARING, P.CANCELLED}),
    P.BACKOFF: frozenset({P.PENDING, P.CANCELLED}),
    P.PREPARING: frozenset({P.PREPARING, P.RUNNING, P.TERMINATING, P.SUCCEEDED, P.FAILED, P.BACKOFF, P.UNKNOWN}),
    P.RUNNING: frozenset({P.RUNNING, P.TERMINATING, P.SUCCEEDED, P.FAILED, P.BACKOFF, P.UNKNOWN}),
    P.TERMINATING: frozenset(
        {P.TERMINATING, P.CANCELLED, P.TIMED_OUT, P.PREEMPTED, P.PENDING, P.FAILED, P.BACKOFF, P.SUCCEEDED}
    ),
    P.UNKNOWN: frozenset({P.RUNNING, P.TERMINATING, P.FAILED, P.PENDING, P.SUCCEEDED, P.BACKOFF}),
    # A stopped (restartable) job may be restarted as a new attempt.
    P.CANCELLED: frozenset({P.PENDING}),
    P.SUCCEEDED: frozenset(),
    P.FAILED: frozenset({P.PENDING}),
    P.TIMED_OUT: frozenset({P.PENDING}),
    P.PREEMPTED: frozenset({P.PENDING}),
}


class InvalidTransition(Exception):
    def __init__(self, current: str, target: str):
        super().__init__(f"cannot go from {current} to {target}")
        self.current = current
        self.target = target


def can_transition(current: str, target: str) -> bool:
    return Phase(target) in TRANSITIONS[Phase(current)]


def check_transition(current: str, target: str) -> None:
    if not can_transition(current, target):
        raise InvalidTransition(current, target)


def is_terminal(phase: str) -> bool:
    return phase in TERMINAL_PHASES


def holds_resources(phase: str) -> bool:
    return phase in RESOURCE_PHASES


class Color:
    GREEN = "#599b3e"
    ORANGE = "#fd8608"
    BLUE = "#0000ff"
    GREY = "#afafaf"
    RED = "#fb0007"
    LIGHT_GREY = "#d0d0d0"


COLOR_NAMES = {
    Color.GREEN: "green",
    Color.ORANGE: "orange",
    Color.BLUE: "blue",
    Color.GREY: "grey",
    Color.RED: "red",
    Color.LIGHT_GREY: "lightgrey",
}

PHASE_COLORS: dict[Phase, str] = {
    P.SUBMITTED: Color.ORANGE,
    P.INADMISSIBLE: Color.ORANGE,
    P.PENDING: Color.ORANGE,
    P.BACKOFF: Color.RED,
    P.PREPARING: Color.GREEN,
    P.RUNNING: Color.GREEN,
    P.TERMINATING: Color.GREEN,
    P.SUCCEEDED: Color.BLUE,
    P.FAILED: Color.RED,
    P.CANCELLED: Color.GREY,
    P.TIMED_OUT: Color.GREY,
    P.PREEMPTED: Color.GREY,
    P.UNKNOWN: Color.LIGHT_GREY,
}

# Statuses shown in red whatever their phase: errors the user must look at.
ERROR_STATUSES = frozenset(
    {
        "Error",
        "Fail",
        "ErrImagePull",
        "ImagePullBackOff",
        "Init:Error",
        "Init:CrashLoopBackOff",
        "CrashLoopBackOff",
        "ContainerCannotRun",
        "OOMKilled",
    }
)


# Statuses shown in orange whatever their phase: waiting, e.g. a pod no node has taken yet (Run:ai's Pending).
WAITING_STATUSES = frozenset({"Pending"})


def color_for(phase: str, status: str) -> str:
    """The colour of a job, derived from its phase and status (never stored)."""
    if status in ERROR_STATUSES:
        return Color.RED
    if status in WAITING_STATUSES:
        return Color.ORANGE
    return PHASE_COLORS[Phase(phase)]


def color_name(phase: str, status: str) -> str:
    return COLOR_NAMES[color_for(phase, status)]
