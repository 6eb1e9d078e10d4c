"""Which reading belongs to which attempt (pure). Local: the GPU ids the scheduler placed each replica on
(``Attempt.placement`` {rank: {node, gpu_ids}}). Kubernetes: the exporter's pod label, against our pod names."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .samples import GpuReading

POD = re.compile(r"^job-(\d+)-(\d+)-(\d+)$")  # scheduler.backends.k8s_manifest.pod_name


@dataclass(frozen=True)
class RunningAttempt:
    attempt_id: int
    job_id: int
    number: int
    placement: dict


def attribute(readings: list[GpuReading], attempts: list[RunningAttempt], *, namespace: str = ""
              ) -> dict[int, list[tuple[int, GpuReading]]]:
    """{attempt id: [(rank, reading), ...]}; readings nobody of ours uses are left out."""
    by_pod = {(a.job_id, a.number): a for a in attempts}
    by_device: dict[tuple[str, str], tuple[RunningAttempt, int]] = {}
    for a in attempts:
        for rank, where in (a.placement or {}).items():
            for gpu in where.get("gpu_ids", where.get("devices", [])) or []:
                by_device[(where.get("node", ""), str(gpu))] = (a, int(rank))
    out: dict[int, list[tuple[int, GpuReading]]] = {}
    for reading in readings:
        owner = None
        if reading.pod:
            match = POD.match(reading.pod)
            if match and (not namespace or reading.namespace == namespace):
                attempt = by_pod.get((int(match[1]), int(match[2])))
                if attempt is not None:
                    owner = (attempt, int(match[3]))
        else:
            owner = by_device.get((reading.node, reading.gpu))
        if owner is not None:
            out.setdefault(owner[0].attempt_id, []).append((owner[1], reading))
    return out
