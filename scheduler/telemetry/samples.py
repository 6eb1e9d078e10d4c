"""What every sampler returns: one reading of one GPU, and who it belongs to."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one moment, as its node names it (``gpu``: the index, ``uuid`` when known). ``pod``/``namespace``:
    the workload the exporter attributes it to (Kubernetes only)."""

    node: str
    gpu: str
    sm: float
    mem_used: int
    mem_total: int
    power_w: float
    temp_c: float
    uuid: str = ""
    pod: str = ""
    namespace: str = ""

    def point(self, epoch: int) -> list:
        """The stored form: [epoch, SM %, memory used B, memory total B, power W, temperature C]."""
        return [epoch, round(self.sm, 1), self.mem_used, self.mem_total, round(self.power_w, 1), round(self.temp_c, 1)]
