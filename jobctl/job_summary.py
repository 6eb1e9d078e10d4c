"""What jobctl says of one job in a few words, shared by several commands: its API path, its GPUs, why it waits,
when it should start, and a one-line brief after an action."""

from __future__ import annotations

from datetime import datetime

from .output import Printer, parse_time


def job_path(job_id: int, action: str = "") -> str:
    return f"/api/v1/jobs/{job_id}/" + (f"{action}/" if action else "")


def gpus(job: dict) -> int:
    request = job.get("request") or {}
    return int(request.get("gpu") or 0) * int(job.get("replicas") or 1)


def wait_info(job: dict) -> str:
    if job.get("phase") == "PENDING" and job.get("queue_position"):
        return f"#{job['queue_position']} {job.get('reason') or ''}: {job.get('message') or ''}".strip(": ")
    return job.get("message") or job.get("reason") or ""


def est_start(job: dict) -> str:
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


def print_job_brief(out: Printer, job: dict, verb: str) -> None:
    out.line(f"job {job['id']} ({job['name']}) {verb}: {out.status(job)}"
             + (f" — {wait_info(job)}" if wait_info(job) else ""))
