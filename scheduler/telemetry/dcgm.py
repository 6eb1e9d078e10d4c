"""The Kubernetes sampler: NVIDIA's DCGM exporter, scraped from JOBSITE_GPU_METRICS_URL (Prometheus text format),
parsed with prometheus-client's parser. Each GPU's series carry the pod and namespace using it."""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from .samples import GpuReading

MIB = 1024 * 1024
MAX_BYTES = 1 << 22
FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": "sm",
    "DCGM_FI_DEV_FB_USED": "fb_used",
    "DCGM_FI_DEV_FB_FREE": "fb_free",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
}


def dcgm_parse(text: str) -> list[GpuReading]:
    """Pure: one reading per GPU (keyed by Hostname and UUID) from an exporter scrape. Memory is in MiB there."""
    gpus: dict[tuple[str, str], dict] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = FIELDS.get(sample.name)
            if field is None:
                continue
            labels = sample.labels
            key = (labels.get("Hostname", ""), labels.get("UUID") or labels.get("gpu", ""))
            gpu = gpus.setdefault(key, {"labels": labels})
            gpu[field] = sample.value
            if labels.get("pod") and not gpu["labels"].get("pod"):
                gpu["labels"] = labels
    readings = []
    for (host, _), values in sorted(gpus.items()):
        labels = values["labels"]
        used = int(values.get("fb_used", 0) * MIB)
        readings.append(GpuReading(
            node=host, gpu=labels.get("gpu", ""), uuid=labels.get("UUID", ""), sm=float(values.get("sm", 0.0)),
            mem_used=used, mem_total=used + int(values.get("fb_free", 0) * MIB),
            power_w=float(values.get("power_w", 0.0)), temp_c=float(values.get("temp_c", 0.0)),
            pod=labels.get("pod", ""), namespace=labels.get("namespace", ""),
        ))
    return readings


class DcgmSampler:
    source = "dcgm"

    def __init__(self, url: str, timeout: float = 5.0):
        self.url = url
        self.timeout = timeout

    def read(self) -> list[GpuReading]:
        """One scrape, at most 4 MiB and ``timeout`` seconds in all (an exporter that trickles is cut off too)."""
        deadline = time.monotonic() + self.timeout
        body = bytearray()
        with urllib.request.urlopen(self.url, timeout=self.timeout) as response:  # noqa: S310 (an admin's URL)
            while len(body) < MAX_BYTES:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the scrape took over {self.timeout:g} s")
                chunk = response.read(min(1 << 16, MAX_BYTES - len(body)))
                if not chunk:
                    break
                body += chunk
        return dcgm_parse(body.decode("utf-8", "replace"))
