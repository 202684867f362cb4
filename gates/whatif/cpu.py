"""This machine's CPU as a what-if device: nominal peaks from its cores, clock and vector units.

The figures are nominal, not measured: peak FLOPs = cores x clock x FLOPs per cycle of the widest
vector unit the CPU reports (two FMA pipes assumed), and a stated bandwidth per core (a virtual
machine's share of its host's memory bandwidth is not knowable from inside). Calibration
(`gates.whatif.calibrate`) fits the compute and memory efficiencies to a measured baseline, so the
two knobs absorb the error of these nominal figures, and with it every cost the roofline leaves
out (the engine's per-step Python, sampling, the HTTP front end).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gates.whatif.calibrate import describe_device
from gates.whatif.hardware import Device

CPUINFO = Path("/proc/cpuinfo")
MEMINFO = Path("/proc/meminfo")
# A stated nominal figure, not a measurement: what one core of a current server streams from DRAM.
BANDWIDTH_GBS_PER_CORE = 10.0
# fp32 FLOPs per cycle per core: lanes x 2 (FMA) x 2 pipes.
_FP32_PER_CYCLE = {"avx512f": 16 * 2 * 2, "avx2": 8 * 2 * 2}


def _field(text: str, name: str) -> str:
    match = re.search(rf"^{re.escape(name)}\s*:\s*(.*)$", text, re.MULTILINE)
    return match.group(1).strip() if match else ""


def cpu_device(
    cpuinfo: str | None = None,
    cores: int | None = None,
    memory_gib: float | None = None,
    bandwidth_gbs_per_core: float = BANDWIDTH_GBS_PER_CORE,
) -> Device:
    """The CPU described from /proc/cpuinfo (or the given text): key 'cpu', placeholder
    efficiencies that `calibrate` replaces.

    bf16 runs at twice the fp32 rate with AVX512_BF16, int8 at four times with VNNI (AVX512-VNNI
    or AVX-VNNI); without them both run at the fp32 rate. No fp8 (vLLM's CPU backend has none).
    """
    text = cpuinfo if cpuinfo is not None else CPUINFO.read_text()
    flags = set(_field(text, "flags").split())
    model = _field(text, "model name") or "unknown CPU"
    mhz = float(_field(text, "cpu MHz") or 2000.0)
    cores = cores or len(os.sched_getaffinity(0))
    unit = "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else ""
    fp32 = _FP32_PER_CYCLE.get(unit, 8)
    bf16 = fp32 * (2 if "avx512_bf16" in flags else 1)
    int8 = fp32 * (4 if flags & {"avx512_vnni", "avx_vnni"} else 1)
    scale = cores * mhz * 1e6 / 1e12
    if memory_gib is None:
        kib = re.search(r"MemTotal:\s*(\d+)", MEMINFO.read_text()) if MEMINFO.exists() else None
        memory_gib = int(kib.group(1)) / 2**20 if kib else 16.0
    extras = ", ".join(f for f in ("avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16") if f in flags)
    name = (f"{model}, {cores} cores at {mhz:.0f} MHz, {unit or 'no AVX2'}"
            + (f" ({extras})" if extras else ""))
    found = describe_device(
        "cpu",
        tflops={"bf16": bf16 * scale, "int8": int8 * scale},
        bandwidth_gbs=bandwidth_gbs_per_core * cores,
        memory_gib=memory_gib,
        name=name,
    )
    return found.model_copy(update={"source": (
        f"nominal: {fp32} fp32 / {bf16} bf16 / {int8} int8 FLOPs per cycle per core x {cores} "
        f"cores x {mhz:.0f} MHz; {bandwidth_gbs_per_core:g} GB/s per core (stated, not measured)"
    )})
