"""What an array or sweep submission means, as pure functions: the ``array`` text ("0-99", "1,3,5-7", "0-15:4",
"0-99%8", "%2") parsed into its indices and ``%K`` limit, a ``sweep`` grid ({name: [values]}) expanded into its
product in a stable order, and each member's name and environment. No database, no Django.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import limits

MEMBERS_MAX = 10_000  # members of one array or sweep
INDEX_MAX = 1_000_000  # highest index an array may name
ARRAY_TEXT_MAX = 200  # JobArray.indices
SWEEP_NAME_RE = re.compile(r"^[A-Za-z0-9_]{1,64}$")  # SWEEP_<NAME> is then a valid variable name
SWEEP_VALUE_MAX = 256  # characters of one value (it is also in the member's name)

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")

ParamValue = str | int | float


class ArrayError(ValueError):
    """A submission's ``array`` or ``sweep`` that cannot be made into members: ``field`` and a message for it."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ArrayPlan:
    """The members a submission makes: their indices and (a sweep) parameters, in order, and the ``%K`` limit."""

    indices: tuple[int, ...]
    params: tuple[dict[str, ParamValue], ...]  # one per member; empty dicts for an index array
    max_running: int | None
    text: str  # the array text as stored ("" for a sweep without a limit)
    sweep: dict[str, list[ParamValue]] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.indices)


def parse_array(text: str) -> tuple[list[int], int | None]:
    """``"0-9,20-29:2%4"`` → (sorted distinct indices, limit or None). ``"%4"`` gives no indices (a limit for a
    sweep). Raises ``ArrayError`` naming the first thing wrong."""
    text = text.strip().replace(" ", "")
    if not text:
        raise ArrayError("array", 'Give indices such as "0-99", "1,3,5-7" or "0-99%8".')
    if len(text) > ARRAY_TEXT_MAX:
        raise ArrayError("array", f"Use at most {ARRAY_TEXT_MAX} characters.")
    ranges, _, limit_text = text.partition("%")
    limit = None
    if "%" in text:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ArrayError("array", f"'%{limit_text}': the limit after % is a whole number of 1 or more.")
        limit = int(limit_text)
    indices: set[int] = set()
    for part in ranges.split(",") if ranges else []:
        match = _RANGE_RE.match(part)
        if not match:
            raise ArrayError("array", f"'{part[:20]}' is not an index or range (e.g. 7, 0-99 or 0-99:2).")
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        step = int(match[3]) if match[3] is not None else 1
        if last < first:
            raise ArrayError("array", f"'{part}': the range ends before it starts.")
        if step < 1:
            raise ArrayError("array", f"'{part}': the step is 1 or more.")
        if last > INDEX_MAX:
            raise ArrayError("array", f"'{part}': indices go up to {INDEX_MAX:,}.")
        if (last - first) // step + 1 + len(indices) > MEMBERS_MAX:
            raise ArrayError("array", f"An array has at most {MEMBERS_MAX:,} members.")
        indices.update(range(first, last + 1, step))
    if len(indices) > MEMBERS_MAX:
        raise ArrayError("array", f"An array has at most {MEMBERS_MAX:,} members.")
    return sorted(indices), limit


def _value_problem(name: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return f"The values of '{name}' are strings or numbers."
    text = str(value)
    if not text or len(text) > SWEEP_VALUE_MAX:
        return f"A value of '{name}' has 1 to {SWEEP_VALUE_MAX} characters."
    if any(ord(c) < 32 for c in text):
        return f"A value of '{name}' contains control characters."
    return None


def expand_sweep(sweep: Mapping[str, Any]) -> list[dict[str, ParamValue]]:
    """The grid's product in a stable order: the sweep's keys in the order given, the last one varying fastest
    (``{"lr": [1, 2], "bs": [32, 64]}`` → lr=1,bs=32; lr=1,bs=64; lr=2,bs=32; lr=2,bs=64)."""
    if not isinstance(sweep, Mapping) or not sweep:
        raise ArrayError("sweep", "Give the sweep as an object of name: [values].")
    seen: dict[str, str] = {}
    size = 1
    for name, values in sweep.items():
        if not isinstance(name, str) or not SWEEP_NAME_RE.match(name):
            raise ArrayError("sweep", f"'{str(name)[:40]}' is not a sweep name (1 to 64 letters, digits and _).")
        upper = name.upper()
        if upper in seen:
            raise ArrayError("sweep", f"'{name}' and '{seen[upper]}' are both SWEEP_{upper}.")
        seen[upper] = name
        if not isinstance(values, list | tuple) or not values:
            raise ArrayError("sweep", f"Give '{name}' a non-empty list of values.")
        texts = set()
        for value in values:
            problem = _value_problem(name, value)
            if problem:
                raise ArrayError("sweep", problem)
            if str(value) in texts:
                raise ArrayError("sweep", f"'{name}' has the value {str(value)[:40]} twice.")
            texts.add(str(value))
        size *= len(values)
        if size > MEMBERS_MAX:
            raise ArrayError("sweep", f"A sweep has at most {MEMBERS_MAX:,} members (the product of its lists).")
    names = list(sweep)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(sweep[n] for n in names))]


def array_plan(*, array: str | None = None, sweep: Mapping[str, Any] | None = None) -> ArrayPlan:
    """The members of a submission with ``array`` text and/or a ``sweep`` grid. With both, the array text is only
    a limit ("%K"): a sweep's members are its grid's points, indexed 0..n-1."""
    if sweep is not None:
        grid = expand_sweep(sweep)
        limit = None
        text = ""
        if array is not None:
            indices, limit = parse_array(array) if array.strip() else ([], None)
            if indices or limit is None:
                raise ArrayError("array", 'With a sweep, give only a limit here, as "%2" (at most 2 at once).')
            text = f"%{limit}"
        return ArrayPlan(indices=tuple(range(len(grid))), params=tuple(grid), max_running=limit, text=text,
                         sweep={name: list(values) for name, values in sweep.items()})
    if array is None:
        raise ArrayError("array", "Give an array or a sweep.")
    indices, limit = parse_array(array)
    if not indices:
        raise ArrayError("array", 'Give indices before the limit, as "0-9%2" (a limit alone goes with a sweep).')
    text = array.strip().replace(" ", "")
    return ArrayPlan(indices=tuple(indices), params=tuple({} for _ in indices), max_running=limit, text=text)


def member_name(base: str, index: int, params: Mapping[str, ParamValue]) -> str:
    """``train[7]``, or for a sweep ``train[lr=0.0001,bs=32]`` (parameters in the sweep's order); the base is
    shortened to keep the name within ``limits.NAME_MAX`` (the index when even the parameters do not fit)."""
    inner = ",".join(f"{k}={v}" for k, v in params.items()) if params else str(index)
    if len(inner) + 2 > limits.NAME_MAX // 2:
        inner = str(index)
    return f"{base[:limits.NAME_MAX - len(inner) - 2]}[{inner}]"


def member_env(env: Mapping[str, str], array_id: int, index: int, params: Mapping[str, ParamValue]) -> dict[str, str]:
    """A member's variables: the job's, then ``JOB_ARRAY_ID``, ``JOB_ARRAY_INDEX`` and ``SWEEP_<NAME>`` (each
    value as given)."""
    return {
        **env,
        "JOB_ARRAY_ID": str(array_id),
        "JOB_ARRAY_INDEX": str(index),
        **{f"SWEEP_{name.upper()}": str(value) for name, value in params.items()},
    }
