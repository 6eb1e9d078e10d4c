"""Dependencies between jobs, decided without the database: an ``after`` list read and checked, whether one
dependency is met, can never be met or is not decided yet given the phases of what it waits for, the words that
say so, and cycles in a graph of dependencies.

``after`` is a list of ``{"job": 12, "when": "ok"}`` or ``{"array": 5, "when": "any"}``: ``when`` is ``ok``
(succeeded), ``notok`` (ended without succeeding) or ``any`` (ended), as Slurm's afterok / afternotok / afterany;
``ok`` when left out. An array's dependency is decided once every member of it has ended: ``ok`` when all
succeeded, ``notok`` when one did not.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .choices import TERMINAL_PHASES, DependencyWhen, Phase

AFTER_MAX = 100  # dependencies of one submission
KINDS = ("job", "array")


class AfterInvalid(ValueError):
    """An ``after`` list that cannot be read: the message says what is wrong, for the ``after`` field."""


@dataclass(frozen=True)
class After:
    """One dependency of a submission: the job or array (``kind``, ``id``) it waits for, and ``when``."""

    kind: str
    id: int
    when: str = DependencyWhen.OK

    @property
    def target(self) -> tuple[str, int]:
        return (self.kind, self.id)

    def as_dict(self) -> dict[str, Any]:
        return {self.kind: self.id, "when": str(self.when)}


class State(enum.StrEnum):
    MET = "met"
    NEVER = "never"  # it can never be met: what it waited for ended the other way
    WAITING = "waiting"  # not decided yet: something it waits for has not ended


def after_parse(value: Any) -> tuple[After, ...]:
    """The dependencies of an ``after`` list; ``AfterInvalid`` naming the first problem (a wrong shape, an unknown
    key, an id that is not a positive whole number, a ``when`` other than ok/notok/any, a target listed twice)."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise AfterInvalid('Give a list of {"job": id, "when": "ok"} or {"array": id, "when": "any"}.')
    if len(value) > AFTER_MAX:
        raise AfterInvalid(f"Give at most {AFTER_MAX} dependencies.")
    found: list[After] = []
    seen: set[tuple[str, int]] = set()
    for n, item in enumerate(value, start=1):
        if not isinstance(item, Mapping):
            raise AfterInvalid(f'Dependency {n}: give an object such as {{"job": 12, "when": "ok"}}.')
        unknown = sorted(str(k) for k in item if k not in (*KINDS, "when"))
        if unknown:
            raise AfterInvalid(f"Dependency {n}: unknown key '{unknown[0]}' (use job or array, and when).")
        kinds = [k for k in KINDS if k in item]
        if len(kinds) != 1:
            raise AfterInvalid(f"Dependency {n}: give either a job or an array to wait for.")
        kind = kinds[0]
        target = item[kind]
        if isinstance(target, bool) or not isinstance(target, int) or not 1 <= target < 2**63:
            raise AfterInvalid(f"Dependency {n}: the {kind} must be a positive whole number (its id).")
        when = item.get("when", DependencyWhen.OK)
        if when not in DependencyWhen.values:
            raise AfterInvalid(f"Dependency {n}: when must be ok, notok or any, not '{str(when)[:20]}'.")
        if (kind, target) in seen:
            raise AfterInvalid(f"{kind.capitalize()} {target} is listed twice.")
        seen.add((kind, target))
        found.append(After(kind, target, DependencyWhen(when)))
    return tuple(found)


def after_from_text(text: str) -> list[dict[str, Any]]:
    """An ``after`` list from its short written form, as a form field or a command line gives it:
    ``"12, 13:any, array/5:notok"`` (a job id or ``array/<id>``, then ``:ok``, ``:notok`` or ``:any``). The result
    is checked by ``after_parse``; ``AfterInvalid`` for a part that is not of that form."""
    found: list[dict[str, Any]] = []
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        target, _, when = part.partition(":")
        kind, _, number = target.strip().rpartition("/")
        kind = kind.strip().lower() or "job"
        if kind not in KINDS or not number.strip().isdigit():
            raise AfterInvalid(f"'{part[:40]}' is not a dependency: write 12, 12:any or array/5:notok.")
        found.append({kind: int(number), "when": when.strip().lower() or DependencyWhen.OK})
    return found


def dependency_state(when: str, phases: Iterable[str]) -> State:
    """Whether a dependency with ``when`` is met, given the phases of what it waits for (one job's phase, or the
    phases of every member of an array). Not decided while any of them has not ended."""
    phases = list(phases)
    if any(p not in TERMINAL_PHASES for p in phases):
        return State.WAITING
    succeeded = [p == Phase.SUCCEEDED for p in phases]
    if when == DependencyWhen.OK:
        return State.MET if all(succeeded) else State.NEVER
    if when == DependencyWhen.NOTOK:
        return State.MET if not all(succeeded) else State.NEVER
    return State.MET


CONDITION = {
    DependencyWhen.OK: "to succeed",
    DependencyWhen.NOTOK: "to end without succeeding",
    DependencyWhen.ANY: "to end",
}

ENDED_AS = {
    Phase.SUCCEEDED: "succeeded",
    Phase.FAILED: "failed",
    Phase.CANCELLED: "was cancelled",
    Phase.TIMED_OUT: "timed out",
    Phase.PREEMPTED: "was preempted",
}


def target_label(kind: str, target_id: int) -> str:
    return f"job {target_id}" if kind == "job" else f"array {target_id}"


def waiting_for(kind: str, target_id: int, when: str) -> str:
    """``"job 12 to succeed"``: what a dependency waits for, in words."""
    label = target_label(kind, target_id)
    if kind == "array" and when == DependencyWhen.OK:
        return f"every job of {label} to succeed"
    if kind == "array" and when == DependencyWhen.NOTOK:
        return f"{label} to end with a job that did not succeed"
    return f"{label} {CONDITION[DependencyWhen(when)]}"


def waits_message(waits: Iterable[tuple[str, int, str]]) -> str:
    """The message of a job waiting for its dependencies ((kind, id, when) each): "Waits for job 12 to succeed"."""
    parts = [waiting_for(*w) for w in waits]
    return "Waits for " + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0])


def ended_words(kind: str, when: str, phases: Iterable[str]) -> str:
    """How a target ended, in words that explain a dependency on it that can never be met: "failed", "was
    cancelled"; for an array "ended with a job that did not succeed"."""
    phases = list(phases)
    if kind == "job":
        return ENDED_AS.get(Phase(phases[0]), "ended") if phases else "ended"
    if when == DependencyWhen.OK:
        return "ended with a job that did not succeed"
    return "ended with every job succeeded"


def never_message(kind: str, target_id: int, when: str, phases: Iterable[str]) -> str:
    """Why a dependency can never be met, for the submitter: "job 12 has already failed; it can never succeed"."""
    goal = "succeed" if when == DependencyWhen.OK else "end without succeeding"
    return f"{target_label(kind, target_id)} has already {ended_words(kind, when, phases)}; it can never {goal}"


def never_event_message(kind: str, target_id: int, when: str, phases: Iterable[str]) -> str:
    """The message of a job ended because a dependency can never be met: "Waited for job 12 to succeed, which can
    never happen: job 12 failed"."""
    return (f"Waited for {waiting_for(kind, target_id, when)}, which can never happen: "
            f"{target_label(kind, target_id)} {ended_words(kind, when, phases)}")


_END = object()


def find_cycle(graph: Mapping[Hashable, Iterable[Hashable]]) -> list[Hashable] | None:
    """A cycle of ``graph`` (node → the nodes it waits for) as the list of its nodes, first one repeated at the
    end (``[a, b, a]``), or None. Nodes missing as keys wait for nothing. Iterative: chains of any length."""
    done: set[Hashable] = set()
    for start in graph:
        if start in done:
            continue
        path: list[Hashable] = [start]
        on_path = {start}
        stack = [iter(graph.get(start, ()))]
        while stack:
            nxt = next(stack[-1], _END)
            if nxt is _END:
                stack.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                continue
            if nxt in on_path:
                return [*path[path.index(nxt):], nxt]
            if nxt in done:
                continue
            path.append(nxt)
            on_path.add(nxt)
            stack.append(iter(graph.get(nxt, ())))
    return None
