"""The commands that make a job: `jobctl submit` (from a YAML file and/or flags; with --array or --sweep an array
of jobs, with --after jobs it waits for) and `jobctl clone`, and the job spec built from their flags."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import yaml

from .client import Api
from .exits import EXIT_OK, UsageError
from .job_summary import job_path, print_job_brief
from .output import Printer

SPEC_FLAGS = {
    # flag dest: API field
    "name": "name", "group": "group", "image": "image", "instance_type": "instance_type", "replicas": "replicas",
    "job_type": "job_type", "priority": "priority", "preemptible": "preemptible", "backoff_limit": "backoff_limit",
    "timeout": "active_deadline_seconds", "ttl": "ttl_seconds_after_finished",
}


def _env_pairs(values: list[str]) -> dict[str, str]:
    env = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {item!r}: use NAME=value")
        env[key] = value
    return env


def spec_from_flags(args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    for dest, api_field in SPEC_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            spec[api_field] = value
    command = getattr(args, "command", None)
    rest = getattr(args, "argv", None) or []
    if command is not None and rest:
        raise UsageError("give the command either with --command or after --, not both")
    if len(rest) == 1:  # one word: a shell command as it is (`-- 'echo a; exit 3'`), as ssh takes one
        command = rest[0]
    elif rest:  # several: a program and its arguments, each kept whole (`-- python3 -c "print('a b')"`)
        command = " ".join(_quote(a) for a in rest)
    if command is not None:
        spec["command"] = command
    if getattr(args, "env", None):
        spec["env"] = _env_pairs(args.env)
    if getattr(args, "array", None) is not None:
        spec["array"] = args.array
    if getattr(args, "sweep", None):
        spec["sweep"] = sweep_from_flags(args.sweep)
    if getattr(args, "after", None):
        spec["after"] = [after_from_flag(item) for item in args.after]
    if getattr(args, "port", None):
        spec["ports"] = [port_from_flag(item) for item in args.port]
    return spec


def port_from_flag(text: str) -> dict[str, Any]:
    """``--port [NAME=]PORT``: a port the job serves through the site (the server checks the rest)."""
    name, sep, number = text.rpartition("=")
    try:
        port = int(number)
    except ValueError:
        raise UsageError(f"--port {text!r}: use [NAME=]PORT, e.g. jupyter=8888") from None
    return {"name": name, "port": port} if sep and name else {"port": port}


def sweep_value(text: str) -> str | int | float:
    """A value as typed: a number when it looks like one ("32" → 32, "1e-4" → 0.0001), else the text."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) else text


def sweep_from_flags(values: list[str]) -> dict[str, list[str | int | float]]:
    """``--sweep lr=1e-4,3e-4 --sweep bs=32,64`` → {"lr": [0.0001, 0.0003], "bs": [32, 64]}."""
    sweep: dict[str, list[str | int | float]] = {}
    for item in values:
        name, sep, rest = item.partition("=")
        name = name.strip()
        parts = [v for v in rest.split(",") if v.strip()]
        if not sep or not name or not parts:
            raise UsageError(f"--sweep {item!r}: use NAME=VALUE,VALUE,...")
        if name in sweep:
            raise UsageError(f"--sweep {name} is given twice")
        sweep[name] = [sweep_value(v) for v in parts]
    return sweep


AFTER_WHEN = ("ok", "notok", "any")


def after_from_flag(item: str) -> dict[str, Any]:
    """``12``, ``12:any`` or ``array/5:notok`` → {"job": 12, "when": "any"} / {"array": 5, "when": "notok"}."""
    target, _, when = item.strip().partition(":")
    kind, _, number = target.strip().rpartition("/")
    kind = kind.lower() or "job"
    when = when.strip().lower() or "ok"
    if kind not in ("job", "array") or not number.isdigit() or int(number) < 1 or when not in AFTER_WHEN:
        raise UsageError(f"--after {item!r}: use ID, ID:ok|notok|any or array/ID:ok|notok|any")
    return {kind: int(number), "when": when}


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def _read_file(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None


def cmd_submit(api: Api, args, out: Printer) -> int:
    flags = spec_from_flags(args)
    body: dict[str, Any] = {"json_body": flags}
    if args.file:
        text = _read_file(args.file)
        if not flags:  # the server reads the YAML (and names its errors by field path)
            body = {"data": text.encode(), "content_type": "application/yaml"}
        else:
            try:
                spec = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise UsageError(f"{args.file}: invalid YAML: {exc}") from None
            if not isinstance(spec, dict):
                raise UsageError(f"{args.file}: a job spec is a YAML mapping of field: value")
            if "env" in flags and isinstance(spec.get("env"), dict):
                flags["env"] = {**spec["env"], **flags["env"]}
            body = {"json_body": {**spec, **flags}}
    elif not flags:
        raise UsageError("give a job file with -f FILE, or the job with flags (see jobctl submit --help)")
    # One Idempotency-Key per invocation, the same on each try: a submit sent again after a lost reply or a 5xx
    # gets the job the first try made instead of making another.
    job = api.submit("/api/v1/jobs/", params={"vocabulary": args.vocabulary}, **body).json()
    if out.data(job):
        return EXIT_OK
    if "members" in job and "size" in job:  # an array or sweep: the array resource
        print_array_brief(out, job)
    else:
        print_job_brief(out, job, f"submitted to {job['group']}")
    return EXIT_OK


def print_array_brief(out: Printer, array: dict) -> None:
    kind = "sweep" if array.get("sweep") else "array"
    limit = f", at most {array['max_running']} at once" if array.get("max_running") else ""
    out.line(f"{kind} {array['id']} ({array['name']}) submitted to {array['group']}: "
             f"{array['size']} member{'' if array['size'] == 1 else 's'}{limit}")
    out.line(f"  jobctl get array/{array['id']}")


def cmd_clone(api: Api, args, out: Printer) -> int:
    job = api.post(job_path(args.id, "clone"), spec_from_flags(args))
    if not out.data(job):
        print_job_brief(out, job, f"cloned from job {args.id} into {job['group']}")
    return EXIT_OK
