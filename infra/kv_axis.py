"""The kv_cache axis of a stage that keeps some decoder layers' KV cache in the model dtype.

vLLM (0.32: `--kv-cache-dtype-skip-layers`, `CacheConfig.kv_cache_dtype_skip_layers`) serves the
quantized cache on every attention layer but the listed ones. The axis names them after the
format: 'fp8_e4m3/skip:0,3' ('/calibrated' before it where the checkpoint carries the scales).
One spelling, read by flows/ (axes, the served check), gates/ (the what-if's bytes) and infra/
(emulation).
"""

from __future__ import annotations

from collections.abc import Iterable

SKIP = "/skip:"


def with_skipped(axis: str, layers: Iterable[int]) -> str:
    """The axis with `layers` kept in the model dtype ('auto' never skips: nothing is quantized)."""
    kept = sorted(set(layers))
    return f"{axis}{SKIP}{','.join(map(str, kept))}" if kept and axis != "auto" else axis


def split_skipped(axis: str) -> tuple[str, tuple[int, ...]]:
    """('fp8_e4m3/calibrated', (0, 3)) from 'fp8_e4m3/calibrated/skip:0,3'; (axis, ()) without."""
    base, _, listed = axis.partition(SKIP)
    return base, tuple(int(layer) for layer in listed.split(",") if layer)


def per_head_scales(config: dict) -> bool:
    """Whether a checkpoint's KV cache scales are per attention head (compressed-tensors
    `kv_cache_scheme.strategy: attn_head`), which only some attention backends serve."""
    scheme = (config.get("quantization_config") or {}).get("kv_cache_scheme") or {}
    return scheme.get("strategy") == "attn_head"


def quantized_share(axis: str, layers: int) -> float:
    """The share of the decoder's layers whose cache is quantized (1.0 without skips)."""
    skipped = len([layer for layer in split_skipped(axis)[1] if layer < layers])
    return (layers - skipped) / layers if layers else 1.0
