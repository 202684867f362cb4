"""Target devices of the what-if: peak throughput, bandwidth, memory and the roofline's efficiencies."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.errors import SpecError, did_you_mean

GPUS_FILE = Path(__file__).with_name("gpus.yaml")
COMPUTE_DTYPES = ("bf16", "fp8", "int8", "fp4")


class Efficiency(BaseModel):
    """The roofline's knobs: shares of peak that a real engine reaches, and fixed per-step costs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compute: float = Field(gt=0, le=1, description="Share of peak FLOPS reached end to end.")
    memory: float = Field(gt=0, le=1, description="Share of peak memory bandwidth reached.")
    step_overhead_ms: float = Field(ge=0, description="Fixed time per engine step.")
    sequence_ms: float = Field(
        default=0.0, ge=0, description="Time per sequence sampled in a step, beyond the roofline "
        "(sampling, per-request bookkeeping, CPU attention kernels): fitted on a CPU, 0 for GPUs.")
    reserved_memory_gib: float = Field(
        ge=0, description="Device memory held besides weights and the KV pool."
    )

    def describe(self) -> str:
        per_sequence = f", {self.sequence_ms:.3g} ms per sequence" if self.sequence_ms else ""
        return (
            f"compute {self.compute:.3g} of peak, memory {self.memory:.3g} of bandwidth, "
            f"{self.step_overhead_ms:g} ms per step{per_sequence}"
        )


class Device(BaseModel):
    """One accelerator (or a CPU the caller describes): what the roofline needs of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(description="Short name used on the command line, e.g. 'h100-sxm'.")
    name: str = Field(description="Full product name.")
    source: str = Field(default="", description="Where the figures come from.")
    tflops: dict[str, float] = Field(description="Dense peak TFLOPS per compute dtype.")
    bandwidth_gbs: float = Field(gt=0, description="Memory bandwidth, GB/s.")
    memory_gib: float = Field(gt=0, description="Memory for weights, KV cache and the rest.")
    efficiency: Efficiency

    def peak_flops(self, dtype: str) -> float:
        """FLOP/s of `dtype`; a dtype the device lacks raises (callers fall back first)."""
        if dtype not in self.tflops:
            raise SpecError(f"{self.key} has no {dtype} peak; it has {', '.join(self.tflops)}")
        return self.tflops[dtype] * 1e12

    def supports(self, dtype: str) -> bool:
        return dtype in self.tflops

    @property
    def bandwidth(self) -> float:
        """Bytes/s."""
        return self.bandwidth_gbs * 1e9

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30


@cache
def load_devices(path: Path = GPUS_FILE) -> dict[str, Device]:
    """Every device in the data file, keyed by its short name."""
    data = yaml.safe_load(path.read_text())
    try:
        default = Efficiency(**data["efficiency"])
        devices = {}
        for key, entry in data["gpus"].items():
            override = entry.pop("efficiency", {})
            efficiency = default.model_copy(update=override)
            devices[key] = Device(key=key, efficiency=efficiency, **entry)
    except (KeyError, TypeError, ValidationError) as error:
        raise SpecError(f"{path}: {error}") from error
    for device in devices.values():
        unknown = set(device.tflops) - set(COMPUTE_DTYPES)
        if unknown:
            raise SpecError(f"{path}: {device.key} has unknown dtypes {sorted(unknown)}")
    return devices


def device(key: str) -> Device:
    """The named GPU of the data file, or an error naming the valid ones."""
    devices = load_devices()
    if key not in devices:
        raise SpecError(f"unknown GPU {key!r}; {did_you_mean(key, tuple(devices))}")
    return devices[key]


def device_named(name: str, memory_gib: float) -> Device | None:
    """The data file's GPU that nvidia-smi's `name` and memory are ("NVIDIA H100 80GB HBM3",
    79.6 GiB: h100-sxm), or None where it holds no such card: another model, a PCIe or NVL
    variant (other clocks and bandwidth), or another memory size (an A100 40GB)."""
    words = name.upper().replace("-", " ").split()
    if "PCIE" in words or "NVL" in words:
        return None
    for candidate in load_devices().values():
        model = candidate.name.upper().split()[1]  # "NVIDIA H100 SXM5 80GB": H100
        if model in words and abs(memory_gib / candidate.memory_gib - 1) <= 0.1:
            return candidate
    return None
