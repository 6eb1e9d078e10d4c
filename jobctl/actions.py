"""The commands that act on existing jobs: `jobctl cancel` and `jobctl stop` (one job or several) and
`jobctl restart`."""

from __future__ import annotations

from .client import Api
from .exits import EXIT_API_ERROR, EXIT_NOT_FOUND, EXIT_OK
from .job_summary import job_path, print_job_brief
from .output import Printer


def _act(api: Api, args, out: Printer, action: str, verb: str) -> int:
    ids = args.ids
    if len(ids) == 1:
        job = api.post(job_path(ids[0], action), params={"vocabulary": getattr(args, "vocabulary", None)})
        if not out.data(job):
            being = job["phase"] == "TERMINATING"
            print_job_brief(out, job, f"being {verb}" if being else verb)
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
    job = api.post(job_path(args.id, "restart"))
    if not out.data(job):
        print_job_brief(out, job, "restarted")
    return EXIT_OK
