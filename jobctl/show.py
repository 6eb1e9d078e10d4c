"""The commands that show jobs: `jobctl list` (a table of jobs), `jobctl get` (a job's state, or an array's with its
members) and `jobctl describe` (its spec, state, attempts and events)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .client import Api
from .exits import EXIT_OK
from .job_summary import est_start, gpus, job_path, wait_info
from .output import Printer, age, amount, duration


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
        row += [gpus(job), age(job.get("created_at")), wait_info(job)]
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
        pairs.append(("Est. start", est_start(job)))
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


def get_target(value: str) -> tuple[str, int]:
    """`jobctl get`'s argument: ``42`` (a job) or ``array/5``; argparse's type (a usage error otherwise)."""
    kind, _, number = value.strip().rpartition("/")
    kind = kind.lower() or "job"
    if kind not in ("job", "array") or not number.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: give a job id (42) or an array (array/5)")
    return kind, int(number)


def _array_fields(array: dict) -> list[tuple[str, Any]]:
    counts = array.get("counts") or {}
    pairs: list[tuple[str, Any]] = [
        ("Array", array["id"]), ("Name", array["name"]), ("Group", array["group"]), ("User", array["user"]),
        ("Kind", f"{'sweep' if array.get('sweep') else 'array'} of {array['size']}"),
    ]
    if array.get("indices"):
        pairs.append(("Indices", array["indices"]))
    if array.get("sweep"):
        pairs.append(("Sweep", "\n".join(f"{k}={','.join(str(v) for v in vals)}"
                                         for k, vals in array["sweep"].items())))
    if array.get("max_running"):
        pairs.append(("At once", f"at most {array['max_running']}"))
    pairs += [("Counts", ", ".join(f"{phase.capitalize().replace('_', ' ')} {n}" for phase, n in counts.items())
               or "-"), ("Created", array.get("created_at"))]
    return pairs


def _get_array(api: Api, array_id: int, out: Printer) -> int:
    array = api.get(f"/api/v1/arrays/{array_id}/")
    if out.data(array):
        return EXIT_OK
    out.fields(_array_fields(array))
    out.line()
    rows = [[m["id"], m["array_index"], m["name"],
             ",".join(f"{k}={v}" for k, v in (m.get("array_params") or {}).items()) or "-",
             m.get("status") or m.get("phase"), m.get("reason") or ""] for m in array.get("members") or []]
    out.table(["ID", "INDEX", "NAME", "PARAMS", "STATUS", "REASON"], rows)
    return EXIT_OK


def cmd_get(api: Api, args, out: Printer) -> int:
    kind, target = args.id if isinstance(args.id, tuple) else ("job", args.id)
    if kind == "array":
        return _get_array(api, target, out)
    job = api.get(job_path(target), vocabulary=args.vocabulary)
    if out.data(job):
        return EXIT_OK
    out.fields(_state_fields(out, job))
    return EXIT_OK


def cmd_describe(api: Api, args, out: Printer) -> int:
    job = api.get(job_path(args.id), vocabulary=args.vocabulary)
    attempts = list(api.pages(job_path(args.id, "attempts")))
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
