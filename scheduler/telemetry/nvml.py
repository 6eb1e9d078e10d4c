"""The local sampler: NVML (``nvidia-ml-py``) on the scheduler's own host. Without a driver ``nvmlInit`` fails and
the sampler reports nothing (virtual GPUs have no telemetry; no figure is ever made up)."""

from __future__ import annotations

import logging
from typing import Any

from .samples import GpuReading

log = logging.getLogger(__name__)
MIB = 1024 * 1024


def load_nvml() -> Any | None:
    """The ``pynvml`` module, initialised; None where there is no library or no driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError_LibraryNotFound / DriverNotLoaded and kin
        log.info("no GPU telemetry: NVML unavailable (%s)", exc)
        return None
    return pynvml


def nvml_read(nvml: Any, node: str) -> list[GpuReading]:
    """Every GPU NVML sees, read once. ``nvml`` is the module (or a stand-in with the same functions)."""
    readings = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        util = nvml.nvmlDeviceGetUtilizationRates(handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            power = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # milliwatts
        except Exception:  # not every board reports power
            power = 0.0
        temp = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        readings.append(GpuReading(node=node, gpu=str(index), uuid=uuid if isinstance(uuid, str) else uuid.decode(),
                                   sm=float(util.gpu), mem_used=int(memory.used), mem_total=int(memory.total),
                                   power_w=float(power), temp_c=float(temp)))
    return readings


class NvmlSampler:
    """Reads this host's GPUs; ``nvml`` injected by tests (a recorded replay), else loaded on first use."""

    source = "nvml"

    def __init__(self, node: str, nvml: Any | None = None):
        self.node = node
        self._nvml = nvml
        self._tried = nvml is not None

    def read(self) -> list[GpuReading]:
        if not self._tried:
            self._tried = True
            self._nvml = load_nvml()
        if self._nvml is None:
            return []
        return nvml_read(self._nvml, self.node)
