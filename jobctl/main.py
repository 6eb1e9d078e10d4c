"""jobctl: submit, follow and manage jobsite GPU jobs from a terminal.

Every command talks to the REST API of one jobsite server (``--server``, else ``$JOBSITE_URL``, else the server
of the last ``jobctl login``, else http://127.0.0.1:8000) with the token ``jobctl login`` saved.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from . import __version__, config
from .client import Api, ApiError, ConnectError
from .output import Printer, age, amount, color_enabled, duration, parse_time

EXIT_OK = 0
EXIT_API_ERROR = 1
EXIT_USAGE = 2
EXIT_CONNECT = 3
EXIT_NOT_FOUND = 4

EPILOG = """\
options of every command (before or after its name):
  --server URL                  jobsite to talk to
  -o, --output table|json|yaml  output format (default table)
  --color auto|always|never     statuses in the web UI's colours (auto: on a terminal, unless $NO_COLOR)

exit codes:
  0  success
  1  the server refused the request (invalid input, not allowed, not logged in, ...) or answered 5xx
  2  usage error (bad arguments, unreadable or invalid job file)
  3  cannot connect to the server
  4  not found (no such job or group, or not one of your groups)

environment:
  JOBSITE_URL      server to use when --server is not given
  XDG_CONFIG_HOME  jobctl keeps its tokens in $XDG_CONFIG_HOME/jobctl/config.json (default ~/.config/jobctl)
  NO_COLOR         set to anything to turn colours off (as --color never)

examples:
  jobctl login --server http://127.0.0.1:8000
  jobctl submit -f job.yaml
  jobctl submit -g phusers --image base-notebook -t gpu-1 -- python train.py --epochs 3
  jobctl list --phase PENDING --phase RUNNING
  jobctl logs -f 42
  jobctl logs 42 --failed --attempt 2
  jobctl get 42 --vocabulary mcli
"""

LOG_CHUNK = 1 << 20
SPEC_FLAGS = {
    # flag dest: API field
    "name": "name", "group": "group", "image": "image", "instance_type": "instance_type", "replicas": "replicas",
    "job_type": "job_type", "priority": "priority", "preemptible": "preemptible", "backoff_limit": "backoff_limit",
    "timeout": "active_deadline_seconds", "ttl": "ttl_seconds_after_finished",
}


class UsageError(Exception):
    pass


# --- helpers ----------------------------------------------------------------------------------------------------


def _job_path(job_id: int, action: str = "") -> str:
    return f"/api/v1/jobs/{job_id}/" + (f"{action}/" if action else "")


def _gpus(job: dict) -> int:
    request = job.get("request") or {}
    return int(request.get("gpu") or 0) * int(job.get("replicas") or 1)


def _wait_info(job: dict) -> str:
    if job.get("phase") == "PENDING" and job.get("queue_position"):
        return f"#{job['queue_position']} {job.get('reason') or ''}: {job.get('message') or ''}".strip(": ")
    return job.get("message") or job.get("reason") or ""


def _est_start(job: dict) -> str:
    """When a pending job is expected to start, in local time (with the date unless today) and on what basis:
    "14:20 (by history)", "18:00 at the latest (by deadlines)"; "not within 30 days" when the scheduler expects
    no start that soon; "-" otherwise."""
    if job.get("phase") != "PENDING":
        return "-"
    when = parse_time(job.get("estimated_start"))
    if when is None:
        return "not within 30 days" if job.get("queue_position") else "-"
    local = when.astimezone()
    shown = f"{local:%H:%M}" if local.date() == datetime.now().astimezone().date() else f"{local:%Y-%m-%d %H:%M}"
    basis = job.get("estimate_basis") or "deadlines"
    return f"{shown}{' at the latest' if basis == 'deadlines' else ''} (by {basis})"


def _env_pairs(values: list[str]) -> dict[str, str]:
    env = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {item!r}: use NAME=value")
        env[key] = value
    return env


def _spec_from_flags(args: argparse.Namespace) -> dict[str, Any]:
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


# --- commands ---------------------------------------------------------------------------------------------------


def cmd_login(api: Api, args, out: Printer) -> int:
    username = args.username or input("Username: ").strip()
    password = args.password if args.password is not None else getpass.getpass("Password: ")
    if not username:
        raise UsageError("a username is needed")
    reply = api.request("POST", "/api/v1/auth/token/", json_body={"username": username, "password": password})
    token = reply.json()["token"]
    data = config.load()
    data.setdefault("servers", {})[api.server] = {"username": username, "token": token}
    data["current"] = api.server
    path = config.save(data)
    print(f"Logged in to {api.server} as {username} (token saved in {path}).", file=sys.stderr)
    return EXIT_OK


def cmd_logout(api: Api, args, out: Printer) -> int:
    data = config.load()
    revoked = ""
    if api.token:
        # Revoke the token on the server too, so a copy of the config file is of no use. The local copy is forgotten
        # whatever the server says (already expired or revoked: 401; unreachable: said, and forgotten anyway).
        try:
            api.request("DELETE", "/api/v1/auth/token/")
            revoked = " (token revoked)"
        except ApiError as exc:
            if exc.status != 401:
                print(f"jobctl: the server did not revoke the token: {exc}", file=sys.stderr)
        except ConnectError as exc:
            print(f"jobctl: the token was not revoked: {exc}", file=sys.stderr)
    if (data.get("servers") or {}).pop(api.server, None) is not None:
        config.save(data)
        print(f"Logged out of {api.server}{revoked}.", file=sys.stderr)
    else:
        print(f"Not logged in to {api.server}.", file=sys.stderr)
    return EXIT_OK


def _print_job_brief(out: Printer, job: dict, verb: str) -> None:
    out.line(f"job {job['id']} ({job['name']}) {verb}: {out.status(job)}"
             + (f" — {_wait_info(job)}" if _wait_info(job) else ""))


def cmd_submit(api: Api, args, out: Printer) -> int:
    flags = _spec_from_flags(args)
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
        _print_job_brief(out, job, f"submitted to {job['group']}")
    return EXIT_OK


def _job_rows(out: Printer, jobs: list[dict], vocabulary: str | None) -> tuple[list[str], list[list[Any]]]:
    headers = ["ID", "NAME", "GROUP", "USER", "STATUS"]
    if vocabulary:
        headers.append(vocabulary.upper())
    headers += ["GPUS", "AGE", "INFO"]
    rows = []
    for job in jobs:
        row = [job["id"], job["name"], job["group"], job["user"], out.status(job)]
        if vocabulary:
            shown = job.get("vocabulary_status", "")
            if job.get("vocabulary_code") is not None:
                shown = f"{job['vocabulary_code']} {shown}"
            row.append(shown)
        row += [_gpus(job), age(job.get("created_at")), _wait_info(job)]
        rows.append(row)
    return headers, rows


def cmd_list(api: Api, args, out: Printer) -> int:
    params = {
        "group": args.group, "user": args.user, "phase": args.phase or None,
        "status": ",".join(args.status) if args.status else None, "job_type": args.job_type,
        "created_after": args.since, "created_before": args.until, "q": args.search,
        "vocabulary": args.vocabulary,
    }
    if args.all:
        jobs = list(api.pages("/api/v1/jobs/", **params))
        count = len(jobs)
    else:
        reply = api.get("/api/v1/jobs/", page=args.page, page_size=args.limit, **params)
        jobs, count = reply["results"], reply["count"]
    if out.data(jobs):
        return EXIT_OK
    if not jobs:
        print("No jobs.", file=sys.stderr)
        return EXIT_OK
    out.table(*_job_rows(out, jobs, args.vocabulary))
    if count > len(jobs):
        print(f"{len(jobs)} of {count} jobs (--page N, --limit N or --all for more)", file=sys.stderr)
    return EXIT_OK


def _state_fields(out: Printer, job: dict) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = [
        ("ID", job["id"]), ("Name", job["name"]), ("Group", job["group"]), ("User", job["user"]),
        ("Status", out.status(job)), ("Phase", job["phase"]),
    ]
    if "vocabulary_status" in job:
        shown = job["vocabulary_status"]
        if job.get("vocabulary_code") is not None:
            shown = f"{job['vocabulary_code']} ({shown})"
        pairs.append(("Vocabulary", shown))
    if job.get("reason"):
        pairs.append(("Reason", job["reason"]))
    if job.get("message"):
        pairs.append(("Message", job["message"]))
    if job.get("queue_position"):
        pairs.append(("Queue position", f"#{job['queue_position']} in {job['group']}"))
    if job.get("phase") == "PENDING" and (job.get("estimated_start") or job.get("queue_position")):
        pairs.append(("Est. start", _est_start(job)))
    if job.get("exit_code") is not None:
        pairs.append(("Exit code", job["exit_code"]))
    current = next((a for a in job.get("attempts") or [] if a["number"] == job.get("current_attempt")), None)
    if current and current.get("failed_rank") is not None:
        pairs.append(("Failed rank", f"{current['failed_rank']} (first to fail in attempt {current['number']}; "
                                     f"its log: jobctl logs {job['id']} --failed)"))
    if job.get("over_quota"):
        pairs.append(("Over quota", "yes: runs on idle resources beyond the group's quota, preempted first"))
    pairs += [
        ("Created", job.get("created_at")), ("Admitted", job.get("admitted_at")),
        ("Started", job.get("started_at")), ("Finished", job.get("finished_at")),
        ("Attempt", job.get("current_attempt")),
    ]
    return pairs


def _spec_fields(job: dict) -> list[tuple[str, Any]]:
    request = job.get("request") or {}
    shape = ", ".join(f"{amount(r, request.get(r))} {r}" for r in ("gpu", "cpu", "memory") if r in request)
    env = "\n".join(f"{k}={v}" for k, v in (job.get("env") or {}).items()) or "-"
    return [
        ("Image", job["image"]), ("Instance type", f"{job['instance_type']} ({shape} per replica)"),
        ("Replicas", job["replicas"]), ("Type", job["job_type"]), ("Priority", job["priority"]),
        ("Preemptible", "yes" if job["preemptible"] else "no"), ("Backoff limit", job["backoff_limit"]),
        ("Timeout", duration(job["active_deadline_seconds"])),
        ("TTL after end", duration(job["ttl_seconds_after_finished"])),
        ("Command", job["command"]), ("Env", env),
    ]


def cmd_get(api: Api, args, out: Printer) -> int:
    job = api.get(_job_path(args.id), vocabulary=args.vocabulary)
    if out.data(job):
        return EXIT_OK
    out.fields(_state_fields(out, job))
    return EXIT_OK


def cmd_describe(api: Api, args, out: Printer) -> int:
    job = api.get(_job_path(args.id), vocabulary=args.vocabulary)
    attempts = list(api.pages(_job_path(args.id, "attempts")))
    if out.data({**job, "attempts": attempts}):
        return EXIT_OK
    out.fields(_state_fields(out, job))
    out.line()
    out.line(out.bold("Spec"))
    out.fields(_spec_fields(job))
    out.line()
    out.line(out.bold("Attempts"))
    if attempts:
        rows = []
        for a in attempts:
            sizes = ", ".join(f"{r['replica']}:{r['size'] if r['size'] is not None else '-'}" for r in a["logs"])
            failed_rank = a.get("failed_rank")
            rows.append([a["number"], a["node"] or "-", a["started_at"], a["ended_at"], a["outcome"] or "-",
                         a["exit_code"], "-" if failed_rank is None else failed_rank, f"{a['gpu_seconds'] / 3600:.2f}",
                         sizes])
        out.table(["#", "NODE", "STARTED", "ENDED", "OUTCOME", "EXIT", "FAILED RANK", "GPU-H",
                   "LOG BYTES (replica:size)"], rows)
    else:
        out.line("none yet")
    out.line()
    out.line(out.bold("Events"))
    rows = [[e["time"], e["type"], e["reason"], e["attempt"], e["message"]] for e in job["events"]]
    out.table(["TIME", "TYPE", "REASON", "ATTEMPT", "MESSAGE"], rows, max_width=100)
    return EXIT_OK


@dataclass
class _Failure:
    """What the logs endpoint says of an attempt (default: the current one) for ``jobctl logs -f --failed``."""

    attempt: int | None  # the attempt asked about (None: the job has no attempt yet)
    current: int | None
    rank: int | None  # its first failed rank (None: none failed so far)
    phase: str
    finished: bool

    @property
    def over(self) -> bool:
        """No replica of the attempt failed, and none will: another attempt followed it, or the job ended."""
        if self.attempt is None:
            return self.finished
        return self.finished or (self.current is not None and self.current != self.attempt)


def _failure(api: Api, job_id: int, attempt: int | None) -> _Failure:
    reply = api.request("GET", _job_path(job_id, "logs"), params={"attempt": attempt, "tail_bytes": 0},
                        accept="application/json, text/plain")
    headers = {k.lower(): v for k, v in reply.headers.items()}

    def number(name: str) -> int | None:
        return int(headers[name]) if headers.get(name) else None

    return _Failure(number("x-log-attempt"), number("x-job-current-attempt"), number("x-log-failed-rank"),
                    headers.get("x-job-phase", "?"), headers.get("x-job-finished") == "true")


def cmd_logs(api: Api, args, out: Printer) -> int:
    stdout = sys.stdout.buffer
    path = _job_path(args.id, "logs")

    def write(chunk: bytes) -> None:
        stdout.write(chunk)
        stdout.flush()

    if not args.follow:
        api.request("GET", path, params={"replica": args.rank, "failed": "true" if args.failed else None,
                                         "attempt": args.attempt, "tail_bytes": args.tail},
                    accept="application/json, text/plain", sink=write)
        return EXIT_OK

    attempt = args.attempt
    pinned = args.attempt is not None
    rank = None if args.failed else (args.rank or 0)  # with --failed: known once a replica of the attempt fails
    shown_failed = False
    offset: int | None = None
    waiting_said = False
    while True:
        if rank is None:
            failure = _failure(api, args.id, attempt)  # unpinned: always the current attempt
            if failure.rank is not None:
                attempt, rank, offset, shown_failed = failure.attempt, failure.rank, None, True
                print(f"--- attempt {attempt}: replica {rank} failed first ---", file=sys.stderr)
                continue
            if failure.over:
                if shown_failed:  # the attempt after a failed one ended without failing
                    return EXIT_OK
                print(f"No replica of attempt {failure.attempt} failed." if failure.attempt else
                      f"Job {args.id} ended before any attempt started: no replica failed.", file=sys.stderr)
                return EXIT_NOT_FOUND
            if not waiting_said:
                where = f"attempt {failure.attempt}, " if failure.attempt else ""
                print(f"waiting for a replica of job {args.id} to fail ({where}{failure.phase})...", file=sys.stderr)
                waiting_said = True
            time.sleep(args.interval)
            continue

        params: dict[str, Any] = {"replica": rank, "attempt": attempt}
        if offset is None and args.tail is not None:
            params["tail_bytes"] = args.tail
        else:
            params["start"] = offset or 0
            params["end"] = (offset or 0) + LOG_CHUNK
        reply = api.request("GET", path, params=params, accept="application/json, text/plain")
        headers = {k.lower(): v for k, v in reply.headers.items()}
        served = headers.get("x-log-attempt") or ""
        current = headers.get("x-job-current-attempt") or ""
        finished = headers.get("x-job-finished") == "true"
        if reply.body:
            write(reply.body)
        offset = int(headers.get("x-log-end") or 0)
        size = int(headers.get("x-log-size") or 0)
        if served and attempt is None:
            attempt = int(served)
        if offset < size:
            continue  # more is there already
        if not pinned and current and attempt is not None and int(current) != attempt:
            if args.failed:  # on to the next attempt's first failed rank, once one fails
                attempt, rank, waiting_said = None, None, False
            else:
                print(f"--- attempt {current} ---", file=sys.stderr)
                attempt, offset = int(current), 0
            continue
        if finished:
            return EXIT_OK
        if not served and not waiting_said:
            print(f"waiting for job {args.id} to start ({headers.get('x-job-phase', '?')})...", file=sys.stderr)
            waiting_said = True
        time.sleep(args.interval)


def _act(api: Api, args, out: Printer, action: str, verb: str) -> int:
    ids = args.ids
    if len(ids) == 1:
        job = api.post(_job_path(ids[0], action), params={"vocabulary": getattr(args, "vocabulary", None)})
        if not out.data(job):
            being = job["phase"] == "TERMINATING"
            _print_job_brief(out, job, f"being {verb}" if being else verb)
        return EXIT_OK
    reply = api.post("/api/v1/jobs/cancel/", {"ids": ids, "stop": action == "stop"})
    if not out.data(reply):
        for r in reply["results"]:
            state = f"{r['status']}" if r["status"] else ""
            mark = verb if r["ok"] else f"not {verb}: {r['detail']}"
            out.line(f"job {r['id']}: {mark}" + (f" ({state})" if state else ""))
    if reply["ok"]:
        return EXIT_OK
    failed = [r for r in reply["results"] if not r["ok"]]
    return EXIT_NOT_FOUND if all(r["status_code"] == 404 for r in failed) else EXIT_API_ERROR


def cmd_cancel(api: Api, args, out: Printer) -> int:
    return _act(api, args, out, "cancel", "cancelled")


def cmd_stop(api: Api, args, out: Printer) -> int:
    return _act(api, args, out, "stop", "stopped")


def cmd_restart(api: Api, args, out: Printer) -> int:
    job = api.post(_job_path(args.id, "restart"))
    if not out.data(job):
        _print_job_brief(out, job, "restarted")
    return EXIT_OK


def cmd_clone(api: Api, args, out: Printer) -> int:
    job = api.post(_job_path(args.id, "clone"), _spec_from_flags(args))
    if not out.data(job):
        _print_job_brief(out, job, f"cloned from job {args.id} into {job['group']}")
    return EXIT_OK


def cmd_queue(api: Api, args, out: Printer) -> int:
    entries = list(api.pages(f"/api/v1/groups/{args.group}/queue/", limit=args.limit))
    if out.data(entries):
        return EXIT_OK
    if not entries:
        print(f"The queue of {args.group} is empty.", file=sys.stderr)
        return EXIT_OK
    rows = [[e["rank"], e["id"], e["name"], e["user"], out.status(e), e["priority"], e["request"]["gpu"],
             age(e["queued_at"]), _est_start(e), f"{e['reason']}: {e['message']}".strip(": ")] for e in entries]
    out.table(["#", "ID", "NAME", "USER", "STATUS", "PRIORITY", "GPUS", "WAITING", "EST. START", "WHY"], rows,
              max_width=80)
    return EXIT_OK


def cmd_groups(api: Api, args, out: Printer) -> int:
    if args.name:
        group = api.get(f"/api/v1/groups/{args.name}/")
        if out.data(group):
            return EXIT_OK
        out.fields([("Name", group["name"]), ("Role", group["role"] or "-"),
                    ("Queue", "stopped" if group["queue_stopped"] else "open"),
                    ("Running jobs", group["running_jobs"]), ("Queued jobs", group["queued_jobs"])])
        out.line()
        out.table(["RESOURCE", "USED", "QUOTA", "LIMIT", "PER USER", "MINE"],
                  [[q["resource"], amount(q["resource"], q["used"]), amount(q["resource"], q["quota"]),
                    amount(q["resource"], q["limit"] if q["limit"] is not None else q["quota"]),
                    amount(q["resource"], q["user_quota"]), amount(q["resource"], q["used_by_me"])]
                   for q in group["quotas"]])
        if group["users"]:
            out.line()
            out.table(["USER", "JOBS", "GPUS", "CPU", "MEMORY"],
                      [[u["user"], u["jobs"], u["used"]["gpu"], amount("cpu", u["used"]["cpu"]),
                        amount("memory", u["used"]["memory"])] for u in group["users"]])
        return EXIT_OK
    groups = list(api.pages("/api/v1/groups/"))
    if out.data(groups):
        return EXIT_OK
    rows = []
    for g in groups:
        gpu = next((q for q in g["quotas"] if q["resource"] == "gpu"), None)
        quota = f"{g['usage']['gpu']}/{amount('gpu', gpu['quota'])}" if gpu else f"{g['usage']['gpu']}/∞"
        rows.append([g["name"], g["role"] or "-", quota, g["my_usage"]["gpu"], g["running_jobs"], g["queued_jobs"]])
    out.table(["GROUP", "ROLE", "GPUS USED/QUOTA", "MINE", "RUNNING", "QUEUED"], rows)
    return EXIT_OK


def cmd_util(api: Api, args, out: Printer) -> int:
    util = api.get("/api/v1/utilisation/")
    if out.data(util):
        return EXIT_OK
    out.line(f"GPUs: {util['gpu_used']} used, {util['gpu_free']} free of {util['gpu_total']}")
    out.line()
    out.table(["NODE", "GPUS", "USED", "FREE"],
              [[n["name"], n["gpu_total"], n["gpu_used"], n["gpu_free"]] for n in util["nodes"]])
    if util["users"]:
        out.line()
        out.table(["USER", "RUNNING", "RUNNING GPUS", "QUEUED", "QUEUED GPUS"],
                  [[u["user"], u["running"], u["running_gpu"], u["queued"], u["queued_gpu"]] for u in util["users"]])
    return EXIT_OK


def cmd_usage(api: Api, args, out: Printer) -> int:
    usage = api.get("/api/v1/usage/", since=args.since, until=args.until, group=args.group, user=args.user)
    if out.data(usage):
        return EXIT_OK
    out.line(f"GPU-hours from {usage['since']} to {usage['until']}: {usage['total_gpu_hours']:g}")
    if usage["rows"]:
        out.line()
        out.table(["DAY", "GROUP", "USER", "GPU-HOURS"],
                  [[r["day"], r["group"], r["user"], f"{r['gpu_hours']:g}"] for r in usage["rows"]])
    return EXIT_OK


# --- arguments --------------------------------------------------------------------------------------------------


def _add_spec_flags(p: argparse.ArgumentParser, *, for_clone: bool = False) -> None:
    p.add_argument("--name", help="job name (default: from the command)")
    if not for_clone:
        p.add_argument("-g", "--group", help="group (queue) to submit to")
    p.add_argument("--image", help="image name (see jobctl groups NAME / the group's images)")
    p.add_argument("-t", "--instance-type", dest="instance_type", help="instance type, e.g. gpu-1")
    p.add_argument("-c", "--command", help="shell command to run; or after --: one word is a shell command as it "
                                           "is ('echo a; exit 3'), several a program and its arguments")
    p.add_argument("-e", "--env", action="append", metavar="NAME=VALUE", help="environment variable (repeatable)")
    p.add_argument("--replicas", type=int)
    p.add_argument("--type", dest="job_type", choices=["training", "interactive"])
    p.add_argument("--priority", choices=["low", "normal", "high"])
    p.add_argument("--preemptible", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--backoff-limit", dest="backoff_limit", type=int, help="retries of a failing training job")
    p.add_argument("--timeout", type=int, metavar="SECONDS", help="active deadline")
    p.add_argument("--ttl", type=int, metavar="SECONDS", help="keep pods/working dirs this long after the end")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", default=argparse.SUPPRESS, help="jobsite URL (default: $JOBSITE_URL, else the "
                                                                    "last login's, else http://127.0.0.1:8000)")
    common.add_argument("-o", "--output", choices=["table", "json", "yaml"], default=argparse.SUPPRESS,
                        help="output format (default table)")
    common.add_argument("--color", choices=["auto", "always", "never"], default=argparse.SUPPRESS,
                        help="colour statuses as the web UI does (default auto: on a terminal, unless $NO_COLOR)")

    parser = argparse.ArgumentParser(
        prog="jobctl", description="Submit, follow and manage GPU jobs on a jobsite server.", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"jobctl {__version__}")
    parser.add_argument("--server", default=None, help=argparse.SUPPRESS)
    parser.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table", help=argparse.SUPPRESS)
    parser.add_argument("--color", choices=["auto", "always", "never"], default="auto", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", required=True)

    def add(name: str, func, help_text: str, **kw) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text, **kw)
        p.set_defaults(func=func)
        return p

    p = add("login", cmd_login, "log in and save a token")
    p.add_argument("-u", "--username")
    p.add_argument("-p", "--password", help="(prompted for when not given)")
    add("logout", cmd_logout, "revoke the token on the server and forget it")

    p = add("submit", cmd_submit, "submit a job from a YAML file (-f) and/or flags",
            epilog="Flags override the file's fields. The file holds the API's fields, e.g.\n\n"
                   "  name: resnet\n  group: phusers\n  image: base-notebook\n  instance_type: gpu-1\n"
                   "  command: python train.py\n  env: {EPOCHS: '10'}\n  replicas: 1\n",
            formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-f", "--file", help="job spec in YAML ('-' for stdin)")
    p.add_argument("--vocabulary", help=argparse.SUPPRESS)
    _add_spec_flags(p)

    p = add("list", cmd_list, "list jobs of your groups, newest first")
    p.add_argument("-g", "--group")
    p.add_argument("-u", "--user")
    p.add_argument("--phase", action="append", help="phase, e.g. PENDING (repeatable)")
    p.add_argument("--status", action="append", help="status, e.g. Running (repeatable)")
    p.add_argument("--type", dest="job_type", choices=["training", "interactive"])
    p.add_argument("--since", help="submitted at or after (ISO date or time)")
    p.add_argument("--until", help="submitted before (ISO date or time)")
    p.add_argument("-q", "--search", help="name contains, or a job id")
    p.add_argument("--vocabulary", help="also show the status as runai, kueue, mcli, modelarts or primehub would")
    p.add_argument("--limit", type=int, default=50, help="jobs per page (default 50, at most 500)")
    p.add_argument("--page", type=int, default=None)
    p.add_argument("--all", action="store_true", help="every matching job (all pages)")

    for name, func, text in (("get", cmd_get, "show a job's state"),
                             ("describe", cmd_describe, "show a job's spec, state, attempts and events")):
        p = add(name, func, text)
        p.add_argument("id", type=int)
        p.add_argument("--vocabulary", help="also show the status as runai, kueue, mcli, modelarts or primehub would")

    p = add("logs", cmd_logs, "print a replica's log; -f follows it until the job ends")
    p.add_argument("id", type=int)
    p.add_argument("-f", "--follow", action="store_true")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", "--replica", dest="rank", type=int, metavar="N",
                       help="replica rank (default 0); --replica is the same")
    which.add_argument("--failed", action="store_true",
                       help="the first rank that failed in the attempt (the one whose exit code it has); with -f, "
                            "waits for a rank to fail")
    p.add_argument("--attempt", type=int, help="attempt number (default: the current one, followed across retries)")
    p.add_argument("--tail", type=int, metavar="BYTES", help="only the last BYTES bytes")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls with -f (default 1)")

    for name, func, text in (("cancel", cmd_cancel, "cancel jobs"),
                             ("stop", cmd_stop, "stop jobs (cancel that can be restarted)")):
        p = add(name, func, text)
        p.add_argument("ids", type=int, nargs="+", metavar="ID")
    p = add("restart", cmd_restart, "run an ended job again as a new attempt")
    p.add_argument("id", type=int)
    p = add("clone", cmd_clone, "submit a copy of a job (flags change fields of the copy)")
    p.add_argument("id", type=int)
    _add_spec_flags(p, for_clone=True)

    p = add("queue", cmd_queue, "a group's queue in order, with reasons")
    p.add_argument("group")
    p.add_argument("--limit", type=int, default=None)
    p = add("groups", cmd_groups, "your groups with quotas and usage; or one group")
    p.add_argument("name", nargs="?")
    add("util", cmd_util, "cluster utilisation: GPUs per node, running and queued per user")
    p = add("usage", cmd_usage, "GPU-hours per day, group and user")
    p.add_argument("--since", help="first day, YYYY-MM-DD (default 30 days ago)")
    p.add_argument("--until", help="last day, YYYY-MM-DD (default today)")
    p.add_argument("-g", "--group")
    p.add_argument("-u", "--user")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `jobctl submit [flags] -- COMMAND ARGS...`: everything after the first -- is the job's command.
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1:]
    args = parser.parse_args(argv)
    if command and args.cmd not in ("submit", "clone"):
        parser.error(f"{args.cmd} takes no command after --")
    args.argv = command
    data = config.load()
    server = config.resolve_server(args.server, data)
    api = Api(server, config.token_for(server, data))
    out = Printer(args.output, color_enabled(args.color))
    try:
        return args.func(api, args, out)
    except UsageError as exc:
        print(f"jobctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConnectError as exc:
        print(f"jobctl: {exc}", file=sys.stderr)
        return EXIT_CONNECT
    except ApiError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        if exc.status == 401 and args.cmd != "login":
            print(f"(not logged in to {server}? run: jobctl login --server {server})", file=sys.stderr)
        return EXIT_NOT_FOUND if exc.status == 404 else EXIT_API_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. jobctl logs 5 | head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
