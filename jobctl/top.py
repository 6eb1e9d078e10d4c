"""`jobctl top`: your running jobs' GPUs now, like nvidia-smi: SM utilisation, memory, power and temperature per
GPU from the job's latest telemetry reading (/api/v1/jobs/{id}/gpu-metrics/)."""

from __future__ import annotations

import sys
from typing import Any

from . import config
from .client import Api
from .exits import EXIT_OK
from .output import Printer, age

GIB = 1024**3
NO_TELEMETRY = "no GPU telemetry (virtual GPUs)"


def top_rows(job: dict, metrics: dict) -> list[list[Any]]:
    """Pure: one row per GPU of a job (its latest reading), or one row saying there is none."""
    idle = f"idle {age(metrics['gpus_idle_since'])}" if metrics.get("gpus_idle_since") else ""
    mean = "-" if metrics.get("gpu_util_mean") is None else f"{metrics['gpu_util_mean']:.0f}%"
    rows = []
    for g in metrics.get("gpus", []):
        if not g["points"]:
            continue
        _, sm, used, total, power, temp = g["points"][-1]
        rows.append([job["id"], job["name"], g["rank"], g["node"], g["gpu"], f"{sm:.0f}%",
                     f"{used / GIB:.1f}/{total / GIB:.0f} GiB", f"{power:.0f} W", f"{temp:.0f} C", mean, idle])
    if not rows:
        rows.append([job["id"], job["name"], "-", "-", "-", "-", NO_TELEMETRY, "", "", mean, idle])
    return rows


def cmd_top(api: Api, args, out: Printer) -> int:
    if args.ids:
        jobs = [api.get(f"/api/v1/jobs/{i}/") for i in args.ids]
    else:
        me = config.load().get("servers", {}).get(api.server, {}).get("username")
        jobs = list(api.pages("/api/v1/jobs/", phase="RUNNING", user=me, limit=args.limit))
    metrics = {j["id"]: api.get(f"/api/v1/jobs/{j['id']}/gpu-metrics/") for j in jobs}
    if out.data(list(metrics.values())):
        return EXIT_OK
    if not jobs:
        print("No running jobs.", file=sys.stderr)
        return EXIT_OK
    rows = [row for j in jobs for row in top_rows(j, metrics[j["id"]])]
    out.table(["ID", "NAME", "RANK", "NODE", "GPU", "SM", "MEMORY", "POWER", "TEMP", "MEAN", "IDLE"], rows,
              max_width=40)
    return EXIT_OK
