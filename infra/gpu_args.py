"""The GPU settings every CUDA engine kind shares: which GPUs, how many per engine, what share
of their memory, and the host's GPUs where nvidia-smi cannot tell (validating elsewhere)."""

from __future__ import annotations

from pydantic import BaseModel, Field

CUDA_ONLY = ("tensor_parallel_size", "cuda_visible_devices", "gpu_memory_gib", "gpu_count")


class GpuArgs(BaseModel):
    """Mixed into a kind's settings (before EngineArgs) to give the placement plan its inputs."""

    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1,
        description="CUDA only: each engine's share of its GPUs' memory (vLLM "
        "--gpu-memory-utilization, SGLang --mem-fraction-static). Left unset, the placement plan "
        "(infra/placement.py) gives 0.9 to an engine alone on its GPUs and splits 0.94 between "
        "engines sharing one (0.47 each for two; 0.31 for three kept up at once).")
    tensor_parallel_size: int = Field(default=1, ge=1, le=64,
                                      description="CUDA only: GPUs per engine (--tensor-parallel-size).")
    cuda_visible_devices: str | None = Field(
        default=None, pattern=r"^\d+(,\d+)*$",
        description="CUDA only: the GPUs this run may use, e.g. '0,1'; default: "
        "CUDA_VISIBLE_DEVICES, else all. The placement plan gives each engine its own from these.")
    gpu_memory_gib: float | None = Field(
        default=None, gt=0, description="CUDA only: each GPU's memory where nvidia-smi cannot "
        "tell (validating on another machine); default: what nvidia-smi says.")
    gpu_count: int | None = Field(default=None, ge=1, le=64,
                                  description="CUDA only: GPUs on the host, with gpu_memory_gib.")

    def check_gpu_settings(self, device: str) -> None:
        """Refuse CUDA settings on another device, and a GPU count without each GPU's memory
        (the kind's own model validator calls it)."""
        named = [name for name in CUDA_ONLY if name in self.model_fields_set]
        if device != "cuda" and named:
            raise ValueError(f"{', '.join(named)}: CUDA settings on device {device!r}; "
                             "set engine.device: cuda or remove them")
        if self.gpu_count is not None and self.gpu_memory_gib is None:
            raise ValueError("gpu_count needs gpu_memory_gib (each GPU's memory)")

    def memory_share_set(self) -> float | None:
        """gpu_memory_utilization when the spec sets it; None leaves it to the placement plan."""
        return (self.gpu_memory_utilization if "gpu_memory_utilization" in self.model_fields_set
                else None)

    def placed(self, visible_devices: str, memory_share: float):
        return self.model_copy(update={"cuda_visible_devices": visible_devices,
                                       "gpu_memory_utilization": memory_share})
