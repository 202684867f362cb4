"""SGLang as an engine kind: its settings (`engine: {kind: sglang}`), its launcher
(`python -m sglang.launch_server`), its facts from /get_server_info and its start-up log, and the
configuration it serves. A CUDA-only engine: PyPI's `sglang` is a CUDA build, so a real run
waits for a GPU host; the tests replay its recorded responses (tests/infra/fake_sglang.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator, model_validator

from infra.checkpoint import read_config, weight_bytes
from infra.engine import MAX_CONTEXT_TOKENS, EngineArgs, EngineFacts, register
from infra.errors import EngineError, SpecError
from infra.gpu_args import GpuArgs
from infra.launch import LaunchedEngine
from infra.placement import host_gpus
from infra.probe import get_json
from infra.quiet import quiet
from infra.refused_flags import AXIS, check_args, typed
from infra.secrets import MASK, redact_args, split_api_key
from infra.values import Seconds

QUIET_ENV = quiet("HF_HUB_OFFLINE", "DO_NOT_TRACK")
_TYPED = typed("SGLang")
# SGLang flags refused in extra_args, as REFUSED_FLAGS is for vLLM (infra/vllm_args.py).
REFUSED_FLAGS: dict[str, str] = {
    "model-path": f"use baseline.checkpoint / a stage's checkpoint{_TYPED}",
    "host": f"use engine.host{_TYPED}",
    "port": f"use engine.port{_TYPED}",
    "dtype": f"use engine.dtype{_TYPED}",
    "context-length": f"use engine.max_model_len{_TYPED}",
    "mem-fraction-static": f"use engine.gpu_memory_utilization{_TYPED}",
    "tp-size": f"use engine.tensor_parallel_size{_TYPED}",
    "base-gpu-id": "the placement plan picks each engine's GPUs (CUDA_VISIBLE_DEVICES); use "
                   "engine.cuda_visible_devices",
    "quantization": f"use engine_flags.quantization{_TYPED}",
    "kv-cache-dtype": f"use engine_flags.kv_cache_dtype{_TYPED}",
    "load-format": f"{AXIS} ('dummy' serves random weights, others quantize on load); serve a "
                   "checkpoint that holds what you mean",
    "json-model-override-args": f"{AXIS} (it can rewrite the model config); edit the "
                                "checkpoint's config.json",
    "quantization-param-path": f"{AXIS} (kv_cache scales); put the scales in the checkpoint",
    "served-model-name": "the served check reads the model path /v1/models reports as its root",
    "chat-template": "the scoring corpus and the comparability gate read the checkpoint's own "
                     "template, not the flag's; put the template in the checkpoint as "
                     "chat_template.jinja",
    "config": "it reads more SGLang options from a file quantgate does not check; list them "
              "in extra_args",
}
# SGLang's --kv-cache-dtype names the FP8 formats in full; quantgate's engine_flags say 'fp8'.
KV_CACHE_DTYPES = {"fp8": "fp8_e4m3", "bfloat16": "auto"}
# Once per tensor-parallel rank: "Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16,
# avail mem=16.00 GB, mem usage=7.08 GB." (python/sglang/srt/model_executor/model_runner.py).
WEIGHT_MEMORY = re.compile(r"Load weight end\..*?mem usage=([\d.]+) GB")
# "KV Cache is allocated. #tokens: 298447, K size: 5.69 GB, V size: 5.69 GB" (memory_pool.py),
# or "... #tokens: 524288, KV size: 17.16 GB" (MLA pools).
KV_MEMORY = re.compile(r"KV Cache is allocated\. #tokens: \d+, (?:K size: ([\d.]+) GB, "
                       r"V size: ([\d.]+) GB|KV size: ([\d.]+) GB)")
GB = float(1 << 30)  # SGLang's "GB" is 2**30 bytes (`/ GB` with GB = 1 << 30 in its sources)
MAX_FRACTION = 0.95


class SglangEngineSpec(GpuArgs, EngineArgs):
    """An SGLang server quantgate starts per stage on a CUDA host."""

    kind: Literal["sglang"]
    host: str = Field(default="127.0.0.1", description="Address the server binds.")
    port: int | None = Field(default=None, ge=1, le=65535,
                             description="Port the server binds; default: a free one per engine.")
    startup_timeout_s: Seconds = Field(default=900, gt=0, description="Deadline for /health.")
    max_model_len: int | None = Field(default=4096, ge=16, le=MAX_CONTEXT_TOKENS,
                                      description="--context-length.")
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        default="bfloat16", description="--dtype for unquantized tensors.")
    extra_args: list[str] = Field(
        default_factory=list,
        description="More SGLang CLI arguments; none that sets an axis or a typed field "
                    "(infra/sglang_engine.py REFUSED_FLAGS).")

    check_extra_args_field = field_validator("extra_args")(
        lambda args: check_args(args, REFUSED_FLAGS))

    @model_validator(mode="after")
    def _gpu_settings(self) -> SglangEngineSpec:
        self.check_gpu_settings("cuda")
        return self

    def serving_device(self) -> str:
        return "cuda"

    def on_gpu(self) -> bool:
        return True

    def keeps_engines(self) -> bool:
        # Placed as vLLM is: its own CUDA_VISIBLE_DEVICES and a share of them, which
        # fraction_of_free turns into --mem-fraction-static from the memory free at its start
        # (kept engines already up included), so engines kept side by side each hold their share.
        return True

    def command(self, checkpoint: Path, flags: Any, python: str = "python",
                reveal: bool = False) -> tuple[list[str], dict[str, str]]:
        """`python -m sglang.launch_server --model-path M --host H --port P ...`; an `--api-key`
        stays on the command line (SGLang reads no environment variable for it), masked in
        what is recorded unless `reveal`."""
        command = [python, "-m", "sglang.launch_server", "--model-path", str(checkpoint),
                   "--host", self.host, "--port", str(self.port), "--dtype", self.dtype]
        if self.max_model_len:
            command += ["--context-length", str(self.max_model_len)]
        if flags.quantization:
            command += ["--quantization", flags.quantization]
        if flags.kv_cache_dtype_skip_layers:
            raise SpecError("SGLang has no per-layer KV cache dtype (vLLM's "
                            "--kv-cache-dtype-skip-layers): serve kv_cache_dtype_skip_layers on vLLM")
        if flags.kv_cache_dtype:
            command += ["--kv-cache-dtype",
                        KV_CACHE_DTYPES.get(flags.kv_cache_dtype, flags.kv_cache_dtype)]
        if self.tensor_parallel_size > 1:
            command += ["--tp", str(self.tensor_parallel_size)]
        command += ["--mem-fraction-static", f"{self.gpu_memory_utilization:g}"]
        extra, api_key = split_api_key(list(self.extra_args) + list(flags.extra_args))
        command += extra if reveal else redact_args(extra)
        if api_key:
            command += ["--api-key", api_key if reveal else MASK]
        env = dict(QUIET_ENV)
        if self.cuda_visible_devices:  # the placement plan's GPUs for this engine
            env["CUDA_VISIBLE_DEVICES"] = self.cuda_visible_devices
        return command, env

    def cache_identity(self, stage: str, flags: Any) -> dict:
        served = self.model_copy(update={"port": 0, "startup_timeout_s": 0})
        command, env = served.command(Path("CHECKPOINT"), flags)
        if "--api-key" in command:  # it guards the server; it changes no measurement
            del command[command.index("--api-key"):][:2]
        return {"kind": "sglang", "version": sglang_version(), "command": command, "env": env}

    def api_key(self) -> str | None:
        return split_api_key(self.extra_args)[1]

    def check_extra_args(self, args: list[str]) -> None:
        check_args(args, REFUSED_FLAGS)

    def config_source(self) -> str:
        return "its /get_server_info has no {missing}"


def sglang_version() -> str:
    import importlib.metadata

    try:
        return f"sglang {importlib.metadata.version('sglang')}"
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def fraction_of_free(share: float, devices: list[int], gpus: list | None = None) -> float:
    """SGLang's --mem-fraction-static for an engine that should hold `share` of each GPU's
    memory. SGLang takes the fraction of the memory free when it starts, not of the device
    (`rest = available_after_load - total_before_load * (1 - mem_fraction_static)`, with
    `total_before_load` the free memory it measured at start: model_runner_kv_cache_mixin.py,
    profile_max_num_token, v0.5.8), so a second engine beside one already up needs a larger
    fraction. Without nvidia-smi: `share` as it is."""
    gpus = host_gpus() if gpus is None else gpus
    free = [(gpu.memory_bytes, gpu.memory_bytes - gpu.used_bytes) for gpu in gpus
            if gpu.index in devices and gpu.memory_bytes > gpu.used_bytes]
    if not free:
        return share
    fraction = max(share * total / available for total, available in free)
    return round(min(fraction, MAX_FRACTION), 3)


def log_memory(log: str) -> tuple[int | None, int | None]:
    """(weight bytes summed over ranks, KV cache bytes of the first rank) from a start-up log."""
    weights = [float(value) for value in WEIGHT_MEMORY.findall(log)]
    kv = KV_MEMORY.search(log)
    kv_bytes = None
    if kv is not None:
        k_size, v_size, both = kv.groups()
        kv_bytes = int((float(both) if both else float(k_size) + float(v_size)) * GB)
    return (int(sum(weights) * GB) if weights else None), kv_bytes


def server_facts(base_url: str, model: dict, info: dict, log: str, command: list[str],
                 env: dict[str, str], disk_bytes: int | None) -> EngineFacts:
    """The facts of a healthy SGLang engine from its /v1/models entry, /get_server_info (its
    server arguments and scheduler info: max_total_num_tokens) and its start-up log."""
    weight_memory, kv_bytes = log_memory(log)
    kv_tokens = info.get("max_total_num_tokens")
    return EngineFacts(
        base_url=base_url, model=model["id"], command=command, env=env,
        version=info.get("version"), kv_cache_tokens=int(kv_tokens) if kv_tokens else None,
        kv_cache_tokens_from="/get_server_info max_total_num_tokens" if kv_tokens else None,
        kv_cache_dtype=info.get("kv_cache_dtype"), kv_cache_bytes=kv_bytes,
        weight_bytes=disk_bytes, weight_memory_bytes=weight_memory,
        quantization=info.get("quantization") or _checkpoint_method(info.get("model_path")),
        attention_backend=info.get("attention_backend"),
        max_model_len=model.get("max_model_len") or info.get("context_length"),
    )


def _checkpoint_method(model_path: str | None) -> str | None:
    """The quant_method of the checkpoint SGLang loaded: it applies a checkpoint's own
    quantization_config without naming it in its server arguments (quantization stays None)."""
    if not model_path or not Path(model_path).is_dir():
        return None
    try:
        qc = read_config(Path(model_path)).get("quantization_config") or {}
    except (OSError, ValueError):
        return None
    return str(qc.get("quant_method") or "").lower() or None


@register
class SglangEngine(LaunchedEngine):
    kind = "sglang"
    args = SglangEngineSpec
    config_from = "its /get_server_info"

    def launch_spec(self) -> SglangEngineSpec:
        devices = [int(i) for i in (self.spec.cuda_visible_devices or "").split(",") if i]
        fraction = fraction_of_free(self.spec.gpu_memory_utilization, devices) if devices \
            else self.spec.gpu_memory_utilization
        return self.spec.model_copy(update={"gpu_memory_utilization": fraction})

    def _facts(self, command: list[str], env: dict[str, str]) -> EngineFacts:
        models = get_json(self.base_url, "/v1/models")["data"]
        return server_facts(self.base_url, models[0], server_info(self.base_url), self.log_text(),
                            command, env, weight_bytes(self.checkpoint))

    @classmethod
    def served_config(cls, facts: EngineFacts, log_text: str) -> dict[str, str]:
        return served_config(server_info(facts.base_url))


def server_info(base_url: str) -> dict:
    """SGLang's /get_server_info: its server arguments, scheduler info and version in one dict
    (python/sglang/srt/entrypoints/http_server.py, get_server_info)."""
    try:
        return get_json(base_url, "/get_server_info")
    except (httpx.HTTPError, ValueError) as err:
        raise EngineError(f"SGLang engine at {base_url} did not answer /get_server_info: "
                          f"{err}") from err


def served_config(info: dict) -> dict[str, str]:
    """The configuration the served check compares, spelt as vLLM's log spells it: a checkpoint
    SGLang quantizes from its own config shows under that method, unquantized as 'None'."""
    config = {"model": info.get("model_path"), "dtype": info.get("dtype"),
              "quantization": info.get("quantization") or _checkpoint_method(info.get("model_path"))
              or "None",
              "kv_cache_dtype": info.get("kv_cache_dtype"), "load_format": info.get("load_format")}
    return {key: str(value) for key, value in config.items() if value is not None}
