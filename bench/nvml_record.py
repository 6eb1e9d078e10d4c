"""Record what a real NVIDIA GPU reports through jobsite's own sampler (scheduler/telemetry/nvml.py): idle, under a
bf16 matrix multiply that keeps it busy, then idle again while a process still holds its memory.

    python3 bench/nvml_record.py --out recording.json       # on a machine with a GPU, nvidia-ml-py and PyTorch

Every ``--every`` seconds it reads each GPU once with NVML's raw calls (the fields tests/telemetry/fake_nvml.py
replays) and once through ``NvmlSampler`` (what the scheduler stores), and writes both with the phase and the time
since the start. It prints per phase the SM % and memory the sampler saw, so a reader sees at once whether busy reads
busy and idle reads idle. Needs no Django and no database: it imports only the sampler.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scheduler.telemetry.nvml import NvmlSampler, load_nvml  # noqa: E402


def raw(nvml) -> list[dict]:
    """Each GPU as NVML reports it, in the fixture's fields (tests/telemetry/fixtures/nvml_readings.json)."""
    devices = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        util, memory = nvml.nvmlDeviceGetUtilizationRates(handle), nvml.nvmlDeviceGetMemoryInfo(handle)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        devices.append({"uuid": uuid if isinstance(uuid, str) else uuid.decode(), "util_gpu": int(util.gpu),
                        "util_memory": int(util.memory), "memory_total": int(memory.total),
                        "memory_used": int(memory.used), "memory_free": int(memory.free),
                        "power_mw": int(nvml.nvmlDeviceGetPowerUsage(handle)),
                        "temperature": int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))})
    return devices


def busy(stop: threading.Event, held: list) -> None:
    """bf16 8192² matrix multiplies back to back until ``stop``; the tensors stay in ``held`` afterwards."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    held.extend([a, b])
    while not stop.is_set():
        for _ in range(20):
            held[2:] = [a @ b]
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--every", type=float, default=0.5)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds idle before the work")
    parser.add_argument("--work", type=float, default=12.0, help="seconds of matrix multiplies")
    parser.add_argument("--after", type=float, default=8.0, help="seconds idle after, the memory still held")
    args = parser.parse_args()
    nvml = load_nvml()
    if nvml is None:
        sys.exit("no NVML here (no driver or no nvidia-ml-py)")
    sampler = NvmlSampler(node="recorded", nvml=nvml)
    stop, held, samples = threading.Event(), [], []
    worker = threading.Thread(target=busy, args=(stop, held), daemon=True)
    start = time.monotonic()
    for phase, seconds in (("idle", args.idle), ("matmul", args.work), ("idle-after", args.after)):
        if phase == "matmul":
            worker.start()
        if phase == "idle-after":
            stop.set()
            worker.join()
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            at = round(time.monotonic() - start, 3)
            readings = sampler.read()
            samples.append({"t": at, "phase": phase, "devices": raw(nvml),
                            "sampler": [asdict(r) for r in readings]})
            time.sleep(args.every)
    Path(args.out).write_text(json.dumps({
        "comment": "Real NVML readings through jobsite's NvmlSampler, recorded by bench/nvml_record.py: idle, bf16 "
                   "matmul, idle with the memory still held. Fields as nvidia-ml-py reports them.",
        "gpu": nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0)),
        "driver": nvml.nvmlSystemGetDriverVersion(), "every": args.every, "samples": samples}, indent=1))
    for phase in ("idle", "matmul", "idle-after"):
        sm = [r["sm"] for s in samples if s["phase"] == phase for r in s["sampler"]]
        mem = [r["mem_used"] / 2**30 for s in samples if s["phase"] == phase for r in s["sampler"]]
        print(f"{phase:10} {len(sm):3} readings: SM % min {min(sm):.0f} median {sorted(sm)[len(sm) // 2]:.0f} "
              f"max {max(sm):.0f}; memory used {min(mem):.1f}-{max(mem):.1f} GiB")


if __name__ == "__main__":
    main()
