"""Where each CUDA engine of a run goes, planned before any starts: GPUs per engine and the
share of a GPU's memory each may take (vLLM's --gpu-memory-utilization, a per-engine budget).

Engines that are not kept up between stages: at most two are up at once, a stage's own and one
beside it (the reference it is timed against in interleaved rounds, or the baseline answering
more items for an adaptive look). On one GPU both share it, so each gets half of what one engine
would; on a host with twice the GPUs an engine takes (and identical ones), the one beside gets its
own. Where the run keeps engines up between stages, infra/keeping.py gives each kept one a slot of
its own on top of this plan, or says why they do not fit. A pure module: device memory, weight
bytes and the KV cache each engine needs are inputs.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, Field

from infra.errors import GpuBusyError, SpecError

GIB = 2**30
# What vLLM holds besides weights and the KV cache (activations at the token budget, CUDA
# graphs, the CUDA context, allocator slack): gates/whatif/gpus.yaml's reserved_memory_gib.
RESERVE_BYTES = 3 * GIB
# vLLM's default: one engine alone takes this share of a GPU.
ALONE_UTILIZATION = 0.9
# Two engines on one GPU together take at most this share (each checks at start-up that the free
# memory covers its own share; the CUDA contexts and the driver need the rest: on an H200, CUDA
# vLLM 0.25.0 at 0.31 held 0.62 GiB past its share, tests/flows/test_cuda_recorded.py).
SHARED_TOTAL = 0.94


class Gpu(BaseModel):
    index: int = Field(description="CUDA device index (nvidia-smi's).")
    name: str = Field(default="GPU", description="Model name, e.g. 'NVIDIA H100 80GB HBM3'.")
    memory_bytes: int = Field(gt=0, description="Total device memory.")
    used_bytes: int = Field(default=0, ge=0, description="Held by other processes when read.")
    compute_capability: str | None = Field(
        default=None, description="nvidia-smi's compute_cap ('9.0' on Hopper); None: not read.")

    @property
    def kind(self) -> tuple[str, int]:
        return self.name, self.memory_bytes


@dataclass(frozen=True)
class EngineNeed:
    """One engine the run may start: what it must hold on its GPUs (all of them together)."""

    role: str  # "stage" (its own stage), "beside" (a reference, or the baseline for more
    # items) or, where engines are kept up, "kept" (a stage's engine held for later stages)
    stage: str  # the stage it serves
    weight_bytes: int
    kv_bytes_per_token: int
    kv_tokens: int  # the KV cache it must hold: the load's concurrency, or one max_model_len
    during: tuple[str, ...] = ()  # the stages during which it may be up (where engines are kept)

    def bytes_per_gpu(self, tensor_parallel_size: int) -> int:
        shared = self.weight_bytes + self.kv_bytes_per_token * self.kv_tokens
        return math.ceil(shared / tensor_parallel_size) + RESERVE_BYTES


class Slot(BaseModel):
    """Where the engines of one role go: the GPUs and each engine's memory share."""

    devices: list[int]
    gpu_memory_utilization: float

    @property
    def visible_devices(self) -> str:
        return ",".join(map(str, self.devices))


class KeptSlot(Slot):
    """A kept stage engine's slot: its own in every stage it may be up in (shared only in turn,
    with engines never up in those stages), so no later engine lands on it."""

    until: str = Field(description="The last stage that uses the engine; it stops after it.")


class Placement(BaseModel):
    """The run's plan: the stage engine's slot, the slot of the engine beside it, and where the
    run keeps engines up between stages, each kept engine's own slot."""

    gpus: list[Gpu]
    tensor_parallel_size: int
    stage: Slot
    beside: Slot | None = Field(default=None, description="None: no engine is started beside.")
    shared: bool = Field(description="The engine beside shares the stage engine's GPUs.")
    engines: list[dict] = Field(default_factory=list,
                                description="Each engine: role, stage, GPUs, share, GiB needed.")
    note: str = ""
    kept: dict[str, KeptSlot] = Field(
        default_factory=dict, description="Stage -> the slot its engine keeps while a later stage "
        "may use it; empty: no engine is kept up between stages.")
    keeping: str = Field(default="", description="Whether engines are kept up, and why not.")
    up_at_once: int = Field(default=2, description="The most engines the plan has up at once.")

    def slot(self, beside: bool, stage: str | None = None) -> Slot:
        """Where an engine of `stage` goes: its kept slot when the run keeps it (as the stage's
        own engine or beside a later one), else the stage engines' or the one beside."""
        if stage in self.kept:
            return self.kept[stage]
        return self.beside if beside and self.beside is not None else self.stage

    def served_on(self) -> Gpu:
        """The GPU the stage engines serve on (the first of theirs): what the run measured."""
        return next(g for g in self.gpus if g.index == self.stage.devices[0])

    def describe(self) -> list[str]:
        """The plan as lines, for validate and the report."""
        first = self.served_on()
        slots = [self.stage, *([self.beside] if self.beside else []), *self.kept.values()]
        used = {device for slot in slots for device in slot.devices}
        lines = [f"{len(self.gpus)} GPU(s), {first.name} {first.memory_bytes / GIB:.0f} GiB; "
                 f"tensor_parallel_size {self.tensor_parallel_size}"
                 + (f"; {len(self.gpus) - len(used)} left unused (at most {self.up_at_once} "
                    "engines are up at once)" if len(used) < len(self.gpus) else "")]
        for role, name, slot in (("stage", "stage engines", self.stage),
                                 ("beside", "engines beside", self.beside)):
            if slot is None or not any(e["role"] == role for e in self.engines):
                continue
            engines = [e for e in self.engines if e["role"] == role]
            largest = max(engines, key=lambda e: e["need_gib"])
            lines.append(
                f"{name} ({', '.join(e['stage'] for e in engines)}): CUDA_VISIBLE_DEVICES="
                f"{slot.visible_devices}, gpu_memory_utilization {slot.gpu_memory_utilization:g} "
                f"({largest['share_gib']:.1f} GiB per GPU; the largest, {largest['stage']}, "
                f"needs {largest['need_gib']:.1f})"
                + (self._beside_note() if role == "beside" else ""))
        for stage, slot in self.kept.items():
            row = next(e for e in self.engines if e["role"] == "kept" and e["stage"] == stage)
            lines.append(f"{stage} engine, kept up through {slot.until}: CUDA_VISIBLE_DEVICES="
                         f"{slot.visible_devices}, gpu_memory_utilization "
                         f"{slot.gpu_memory_utilization:g} ({row['share_gib']:.1f} GiB per GPU; "
                         f"needs {row['need_gib']:.1f})")
        lines += [line for line in (self.note, self.keeping) if line]
        return lines

    def _beside_note(self) -> str:
        if self.kept and self.beside == self.stage:
            return ", in turn with the stage engines in their slot (never up in the same stage)"
        return ", sharing the stage engine's GPUs" if self.shared else ""


def floor_share(value: float) -> float:
    return math.floor(value * 100) / 100


def device_groups(gpus: list[Gpu], size: int, count: int) -> list[list[int]] | None:
    """`count` groups of `size` GPUs, all of one kind (name and memory), or None."""
    by_kind: dict[tuple[str, int], list[int]] = {}
    for gpu in gpus:
        by_kind.setdefault(gpu.kind, []).append(gpu.index)
    for indices in sorted(by_kind.values(), key=len, reverse=True):
        if len(indices) >= size * count:
            return [indices[i * size:(i + 1) * size] for i in range(count)]
    return None


def plan_placement(gpus: list[Gpu], needs: list[EngineNeed], tensor_parallel_size: int = 1,
                   utilization: float | None = None) -> Placement:
    """The placement of `needs` on `gpus`; raise SpecError naming the setting to change when
    they cannot fit. `utilization`: the spec's gpu_memory_utilization when the user set it."""
    if not gpus:
        raise SpecError("engine.device is cuda but no GPU is known: run on the CUDA host "
                        "(nvidia-smi), or set engine.gpu_memory_gib and engine.gpu_count")
    tp = tensor_parallel_size
    if tp > len(gpus):
        raise SpecError(f"engine.tensor_parallel_size {tp} needs {tp} GPUs; this host has "
                        f"{len(gpus)}: set engine.tensor_parallel_size to at most {len(gpus)}")
    beside_needed = any(need.role != "stage" for need in needs)
    pair = device_groups(gpus, tp, 2) if beside_needed else None
    alone = device_groups(gpus, tp, 1) or [[g.index for g in gpus[:tp]]]
    shared = beside_needed and pair is None
    if shared:
        share = utilization if utilization is not None else floor_share(SHARED_TOTAL / 2)
        if 2 * share > SHARED_TOTAL:
            raise SpecError(
                f"engine.gpu_memory_utilization {share:g}: two engines share GPU(s) "
                f"{','.join(map(str, alone[0]))} (a stage and its reference or the baseline "
                f"beside it) and together would take {2 * share:g} of each; set "
                f"engine.gpu_memory_utilization at most {floor_share(SHARED_TOTAL / 2):g}, or leave it "
                f"unset (quantgate splits the GPU)")
        stage = Slot(devices=alone[0], gpu_memory_utilization=share)
        beside = stage
    else:
        share = utilization if utilization is not None else ALONE_UTILIZATION
        groups = pair or alone
        stage = Slot(devices=groups[0], gpu_memory_utilization=share)
        beside = Slot(devices=groups[1], gpu_memory_utilization=share) if pair else None
    _check_free(gpus, stage, 2 if shared else 1)
    if beside is not None and not shared:
        _check_free(gpus, beside, 1)
    memory = {g.index: g.memory_bytes for g in gpus}
    rows = []
    for need in needs:
        slot = beside if need.role != "stage" and beside is not None else stage
        has = min(memory[i] for i in slot.devices) * slot.gpu_memory_utilization
        wanted = need.bytes_per_gpu(tp)
        rows.append({"role": need.role, "stage": need.stage, "devices": slot.devices,
                     "gpu_memory_utilization": slot.gpu_memory_utilization,
                     "need_gib": round(wanted / GIB, 2), "share_gib": round(has / GIB, 2)})
        if wanted > has:
            raise SpecError(
                f"the {need.role} engine of stage {need.stage!r} needs {wanted / GIB:.1f} GiB per "
                f"GPU (weights {need.weight_bytes / GIB:.1f} GiB, KV cache for {need.kv_tokens:,} "
                f"tokens {need.kv_bytes_per_token * need.kv_tokens / GIB:.1f} GiB, over "
                f"{tp} GPU(s), and {RESERVE_BYTES / GIB:.0f} GiB reserve) but gets "
                f"{has / GIB:.1f} GiB (gpu_memory_utilization {slot.gpu_memory_utilization:g}"
                f"{' shared by two engines' if shared else ''}); lower engine.max_model_len or "
                "the load profile's users, raise engine.tensor_parallel_size, or serve on a GPU "
                "with more memory")
    note = ("the engine beside shares the stage engine's GPUs: memory is split, and its rounds "
            "alternate with the stage's, so each runs alone on them" if shared else "")
    if beside_needed and not shared:
        note = "interleaved rounds compare identical GPUs"
    return Placement(gpus=gpus, tensor_parallel_size=tp, stage=stage,
                     beside=beside if beside_needed else None, shared=shared, engines=rows,
                     note=note)


def _check_free(gpus: list[Gpu], slot: Slot, engines: int) -> None:
    """vLLM refuses to start when a GPU's free memory is less than its share of the total
    ("Free memory on device ... is less than desired GPU memory utilization"): a GPU another
    process holds memory on is named before any engine starts."""
    by_index = {g.index: g for g in gpus}
    for index in slot.devices:
        gpu = by_index[index]
        wanted = engines * slot.gpu_memory_utilization * gpu.memory_bytes
        if wanted > gpu.memory_bytes - gpu.used_bytes:
            raise SpecError(
                f"GPU {index} already holds {gpu.used_bytes / GIB:.1f} GiB (another process); "
                f"its free {(gpu.memory_bytes - gpu.used_bytes) / GIB:.1f} GiB is less than the "
                f"{wanted / GIB:.1f} GiB its {engines} engine(s) at gpu_memory_utilization "
                f"{slot.gpu_memory_utilization:g} would take: free the GPU, give idle ones in "
                "engine.cuda_visible_devices, or lower engine.gpu_memory_utilization")


def wait_until_free(devices: list[int], utilization: float, timeout_s: float = 120,
                    gpus: Callable[[], list[Gpu]] | None = None,
                    sleep: Callable[[float], None] = time.sleep) -> None:
    """Before an engine starts: wait until each of its GPUs has the free memory its share needs
    (a stopped engine's memory is released by the driver when its processes are gone, which can
    trail the stop); raise GpuBusyError naming the GPU at the deadline. No nvidia-smi: no check."""
    read = gpus or host_gpus
    waited = 0.0
    while True:
        short = [(gpu, utilization * gpu.memory_bytes) for gpu in read() if gpu.index in devices
                 and utilization * gpu.memory_bytes > gpu.memory_bytes - gpu.used_bytes]
        if not short:
            return
        if waited >= timeout_s:
            gpu, wanted = short[0]
            raise GpuBusyError(
                f"GPU {gpu.index} still holds {gpu.used_bytes / GIB:.1f} GiB after {timeout_s:g} s: "
                f"its free {(gpu.memory_bytes - gpu.used_bytes) / GIB:.1f} GiB is less than the "
                f"{wanted / GIB:.1f} GiB the next engine's gpu_memory_utilization {utilization:g} "
                "takes; stop what holds it (nvidia-smi lists it) and run again")
        sleep(2.0)
        waited += 2.0


def host_gpus(run=subprocess.run) -> list[Gpu]:
    """This host's GPUs as nvidia-smi lists them ([] without nvidia-smi or a GPU), with their
    compute capability where the driver reports it (compute_cap: drivers since 2021)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = _smi(run, "index,name,memory.total,memory.used")
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = parse_nvidia_smi(out)
    try:
        capabilities = dict(line.replace(" ", "").split(",")
                            for line in _smi(run, "index,compute_cap").strip().splitlines())
    except (OSError, subprocess.SubprocessError, ValueError):  # an older driver: not reported
        return gpus
    return [gpu.model_copy(update={"compute_capability": capabilities.get(str(gpu.index))})
            for gpu in gpus]


def _smi(run, fields: str) -> str:
    return run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
               capture_output=True, text=True, timeout=30, check=True).stdout


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """`0, NVIDIA H100 80GB HBM3, 81559, 4` lines (memory total and used in MiB) -> Gpu."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        index, name, total, used = parts[0], ",".join(parts[1:-2]), parts[-2], parts[-1]
        gpus.append(Gpu(index=int(index), name=name, memory_bytes=int(float(total)) * 2**20,
                        used_bytes=int(float(used)) * 2**20))
    return gpus


def declared_gpus(memory_gib: float, count: int, name: str = "GPU") -> list[Gpu]:
    """GPUs a spec declares (engine.gpu_memory_gib, engine.gpu_count) where none is visible."""
    return [Gpu(index=i, name=name, memory_bytes=int(memory_gib * GIB)) for i in range(count)]
