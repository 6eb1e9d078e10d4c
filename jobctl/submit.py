"""The commands that make a job: `jobctl submit` (from a YAML file and/or flags) and `jobctl clone`, and the job
spec built from their flags."""

from __future__ import annotations

import argparse
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
    return spec


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
    if not out.data(job):
        print_job_brief(out, job, f"submitted to {job['group']}")
    return EXIT_OK


def cmd_clone(api: Api, args, out: Printer) -> int:
    job = api.post(job_path(args.id, "clone"), spec_from_flags(args))
    if not out.data(job):
        print_job_brief(out, job, f"cloned from job {args.id} into {job['group']}")
    return EXIT_OK
