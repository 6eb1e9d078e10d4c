"""The workload a replay runs: JSON Lines, one job a line, with an optional header; parsed, checked, changed.

A workload is JSON Lines, one job a line (``parse_workload``); an optional first line, the header, describes the
groups (GPU quota, borrowing limit, per-user quota), the cluster and defaults for every job::

    {"groups": {"team-a": {"quota": 20, "limit": 120}}, "cluster": {"nodes": 30, "gpus_per_node": 20},
     "defaults": {"preemptible": true}}
    {"submit": 0.0, "group": "team-a", "user": "ana", "gpus": 1, "duration": 0.2, "priority": 0, "name": "small"}

``submit`` and ``duration`` are seconds (submit: from the start of the workload). Optional per job: ``user``
("user"), ``priority`` (50, normal), ``replicas`` (1, ``gpus`` each), ``preemptible`` (false), ``name``.
A group the header does not list has no quota. Only GPUs are simulated (no CPU or memory requests).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

JOB_KEYS = {"submit", "group", "user", "gpus", "duration", "priority", "replicas", "preemptible", "name"}
HEADER_KEYS = {"groups", "cluster", "defaults"}


class WorkloadError(ValueError):
    """A workload that cannot be replayed; the message names the line."""


@dataclass(frozen=True)
class GroupSpec:
    quota: int | None = None  # GPUs guaranteed; None: unlimited
    limit: int | None = None  # GPUs preemptible jobs may borrow up to; None: the quota
    user_quota: int | None = None


@dataclass(frozen=True)
class WorkJob:
    submit: float
    group: str
    user: str
    gpus: int  # per replica
    duration: float
    priority: int = 50
    replicas: int = 1
    preemptible: bool = False
    name: str = "job"

    @property
    def gpu_seconds(self) -> float:
        return self.gpus * self.replicas * self.duration


@dataclass
class Workload:
    jobs: list[WorkJob]
    groups: dict[str, GroupSpec] = field(default_factory=dict)
    nodes: int | None = None
    gpus_per_node: int | None = None
    node_list: list[tuple[str, int]] | None = None  # (name, GPUs) of unlike nodes, in place of the two above


def _number(line: int, obj: Mapping, key: str, kind: type, *, minimum: float = 0, required: bool = True,
            default=None):
    if key not in obj:
        if required:
            raise WorkloadError(f"line {line}: missing '{key}'")
        return default
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or (
            kind is float and not math.isfinite(value)):
        raise WorkloadError(f"line {line}: '{key}' must be {'a number' if kind is float else 'an integer'}, "
                            f"got {json.dumps(value)}")
    if value < minimum:
        raise WorkloadError(f"line {line}: '{key}' must be at least {minimum:g}, got {value}")
    return kind(value)


def _optional_int(line: int, obj: Mapping, key: str) -> int | None:
    if obj.get(key) is None:
        return None
    return _number(line, obj, key, int)


def _header(line: int, obj: Mapping, workload: Workload) -> dict:
    unknown = set(obj) - HEADER_KEYS
    if unknown:
        raise WorkloadError(f"line {line}: unknown header key(s) {', '.join(sorted(unknown))}")
    groups = obj.get("groups", {})
    if not isinstance(groups, dict):
        raise WorkloadError(f"line {line}: 'groups' must be an object of group name → quotas")
    for name, spec in groups.items():
        if not isinstance(spec, dict):
            raise WorkloadError(f"line {line}: group '{name}' must be an object (quota, limit, user_quota)")
        quota, limit = _optional_int(line, spec, "quota"), _optional_int(line, spec, "limit")
        if quota is not None and limit is not None and limit < quota:
            raise WorkloadError(f"line {line}: group '{name}': the limit ({limit}) must be at least the quota "
                                f"({quota})")
        workload.groups[name] = GroupSpec(quota, limit, _optional_int(line, spec, "user_quota"))
    cluster = obj.get("cluster", {})
    if not isinstance(cluster, dict):
        raise WorkloadError(f"line {line}: 'cluster' must be an object (nodes, gpus_per_node)")
    workload.nodes = _number(line, cluster, "nodes", int, minimum=1, required=False)
    workload.gpus_per_node = _number(line, cluster, "gpus_per_node", int, minimum=1, required=False)
    defaults = obj.get("defaults", {})
    if not isinstance(defaults, dict) or set(defaults) - (JOB_KEYS - {"submit", "duration"}):
        raise WorkloadError(f"line {line}: 'defaults' must be an object of job fields")
    return defaults


def parse_workload(lines: Iterable[str]) -> Workload:
    """A workload from JSON Lines (see the module's doc). Blank lines are skipped; a bad line raises
    ``WorkloadError`` naming its number."""
    workload = Workload(jobs=[])
    defaults: dict = {}
    seen_job = False
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"line {number}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"line {number}: expected a JSON object")
        if set(obj) & HEADER_KEYS:
            if seen_job or workload.groups or workload.nodes:
                raise WorkloadError(f"line {number}: the header (groups, cluster, defaults) must be the first line")
            defaults = _header(number, obj, workload)
            continue
        seen_job = True
        obj = {**defaults, **obj}
        unknown = set(obj) - JOB_KEYS
        if unknown:
            raise WorkloadError(f"line {number}: unknown key(s) {', '.join(sorted(unknown))}")
        group = obj.get("group")
        if not isinstance(group, str) or not group:
            raise WorkloadError(f"line {number}: 'group' must be a non-empty string")
        preemptible = obj.get("preemptible", False)
        if not isinstance(preemptible, bool):
            raise WorkloadError(f"line {number}: 'preemptible' must be true or false")
        workload.jobs.append(WorkJob(
            submit=_number(number, obj, "submit", float),
            group=group,
            user=str(obj.get("user", "user")),
            gpus=_number(number, obj, "gpus", int),
            duration=_number(number, obj, "duration", float),
            priority=_number(number, obj, "priority", int, minimum=-32768, required=False, default=50),
            replicas=_number(number, obj, "replicas", int, minimum=1, required=False, default=1),
            preemptible=preemptible,
            name=str(obj.get("name", "job")),
        ))
    return workload


def load_workload(path: str | Path) -> Workload:
    try:
        with open(path, encoding="utf-8") as f:
            return parse_workload(f)
    except OSError as exc:
        raise WorkloadError(f"cannot read: {exc.strerror}") from None


def parse_quota_overrides(items: Iterable[str]) -> dict[str, int]:
    """["team-a=24", ...] → {"team-a": 24}."""
    result = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit():
            raise WorkloadError(f"--quota {item!r}: expected GROUP=GPUS, e.g. team-a=16")
        result[name] = int(value)
    return result


def with_quotas(workload: Workload, quotas: Mapping[str, int]) -> Workload:
    """The workload with these groups' GPU quotas changed (a borrowing limit below the new quota rises to it)."""
    groups = dict(workload.groups)
    for name, quota in quotas.items():
        old = groups.get(name, GroupSpec())
        limit = None if old.limit is None else max(old.limit, quota)
        groups[name] = replace(old, quota=quota, limit=limit)
    return replace(workload, groups=groups)


def unknown_groups(workload: Workload, quotas: Mapping[str, int]) -> list[str]:
    """Groups named in ``quotas`` that the workload does not know (a likely typo)."""
    known = {j.group for j in workload.jobs} | set(workload.groups)
    return sorted(set(quotas) - known)
