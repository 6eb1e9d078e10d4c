"""The Kubernetes sampler: NVIDIA's DCGM exporter, scraped from JOBSITE_GPU_METRICS_URL (Prometheus text format),
parsed with prometheus-client's parser. Each GPU's series carry the pod and namespace using it."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from .samples import GpuReading

MIB = 1024 * 1024
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
        with urllib.request.urlopen(self.url, timeout=self.timeout) as response:  # noqa: S310 (an admin's URL)
            return dcgm_parse(response.read(1 << 22).decode("utf-8", "replace"))
