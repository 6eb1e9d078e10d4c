"""The commands about groups and the cluster: `jobctl queue` (a group's queue), `jobctl groups` (quotas and usage),
`jobctl util` (GPUs per node and user) and `jobctl usage` (GPU-hours)."""

from __future__ import annotations

import sys

from .client import Api
from .exits import EXIT_OK
from .job_summary import est_start
from .output import Printer, age, amount


def cmd_queue(api: Api, args, out: Printer) -> int:
    entries = list(api.pages(f"/api/v1/groups/{args.group}/queue/", limit=args.limit))
    if out.data(entries):
        return EXIT_OK
    if not entries:
        print(f"The queue of {args.group} is empty.", file=sys.stderr)
        return EXIT_OK
    rows = [[e["rank"], e["id"], e["name"], e["user"], out.status(e), e["priority"], e["request"]["gpu"],
             age(e["queued_at"]), est_start(e), f"{e['reason']}: {e['message']}".strip(": ")] for e in entries]
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
