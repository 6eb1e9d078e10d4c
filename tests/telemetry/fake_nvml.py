"""A stand-in for the ``pynvml`` module that replays recorded readings (tests/telemetry/fixtures/nvml_readings.json),
with the same functions and value shapes as nvidia-ml-py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

FIXTURES = Path(__file__).parent / "fixtures"


class FakeNvml:
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, devices: list[dict] | None = None):
        self.devices = devices if devices is not None else json.loads(
            (FIXTURES / "nvml_readings.json").read_text())["devices"]

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[index]

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=handle["util_gpu"], memory=handle["util_memory"])

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=handle["memory_total"], used=handle["memory_used"], free=handle["memory_free"])

    def nvmlDeviceGetPowerUsage(self, handle):
        return handle["power_mw"]

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return handle["temperature"]

    def nvmlDeviceGetUUID(self, handle):
        return handle["uuid"]
