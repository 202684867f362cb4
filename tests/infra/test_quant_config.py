"""quantization_config: what compressed-tensors and vLLM's loaders accept passes, the rest is named."""

from __future__ import annotations

import copy

import pytest

from infra.quant_config import quantization_config_problem, quantization_problem
from tests.flows.checkpoints import W4A16, W8A8, W8A16, compressed_tensors, emulated, int_args

# As llm-compressor 0.19 writes it (models/smollm2-135m-w8a8/config.json), every key included.
REAL_W8A8 = {
    "config_groups": {"group_0": {
        "format": "int-quantized",
        "input_activations": {"actorder": None, "block_structure": None, "dynamic": True,
                              "group_size": None, "num_bits": 8, "observer": None,
                              "observer_kwargs": {}, "scale_dtype": None, "strategy": "token",
                              "symmetric": True, "type": "int", "zp_dtype": None},
        "output_activations": None, "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False,
                    "group_size": None, "num_bits": 8, "observer": "memoryless_minmax",
                    "observer_kwargs": {}, "scale_dtype": None, "strategy": "channel",
                    "symmetric": True, "type": "int", "zp_dtype": None}}},
    "format": "int-quantized", "global_compression_ratio": None, "ignore": ["lm_head"],
    "kv_cache_scheme": None, "quant_method": "compressed-tensors",
    "quantization_status": "compressed", "sparsity_config": {}, "transform_config": {},
    "version": "0.19.0",
}
FP8_BLOCK = compressed_tensors(
    {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128],
     "symmetric": True, "dynamic": False},
    {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "dynamic": True})
NVFP4 = compressed_tensors(
    {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "dynamic": False},
    {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
     "dynamic": "local"})
KV_FP8 = dict(W8A8, kv_cache_scheme={"type": "float", "num_bits": 8, "strategy": "tensor",
                                     "dynamic": False, "symmetric": True})


@pytest.mark.parametrize("qc", [
    W8A16, W8A8, W4A16, REAL_W8A8, FP8_BLOCK, NVFP4, KV_FP8,
    compressed_tensors(int_args(4, "group", 128) | {"actorder": "weight", "symmetric": False}),
    {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
    {"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "zero_point": True},
    {"quant_method": "awq", "bits": 4, "group_size": 128},
    {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    {"quant_method": "fp8", "activation_scheme": "static"},
    {"quant_method": "bitsandbytes"},  # unsupported: flows/axes.py names the supported ones
], ids=lambda qc: qc.get("quant_method"))
def test_what_the_loaders_accept_passes(qc):
    assert quantization_config_problem(qc) is None
    assert quantization_problem({"quantization_config": qc}) is None
    assert quantization_problem({"quantgate_emulated": emulated("src", qc)}) is None


def bad(change) -> dict:
    qc = copy.deepcopy(W4A16)
    change(qc, qc["config_groups"]["group_0"]["weights"])
    return qc


WEIGHTS = "quantization_config.config_groups.group_0.weights"


@pytest.mark.parametrize("qc, expected", [
    (bad(lambda q, w: w.update(num_bits=True)), f"{WEIGHTS}.num_bits is true (a boolean)"),
    (bad(lambda q, w: w.update(num_bits=None)), f"{WEIGHTS}.num_bits is missing (or null)"),
    (bad(lambda q, w: w.update(type="float", num_bits=6)),
     f"{WEIGHTS}.num_bits is 6; compressed-tensors type 'float' takes 4 or 8 bits"),
    (bad(lambda q, w: w.update(type="intt")), f"{WEIGHTS}.type is \"intt\"; did you mean 'int'?"),
    (bad(lambda q, w: w.update(strategy="groups")), "did you mean 'group'?"),
    (bad(lambda q, w: w.update(group_size=0)), f"{WEIGHTS}.group_size is 0 (a number)"),
    (bad(lambda q, w: w.update(group_size="64")), f"{WEIGHTS}.group_size is \"64\" (a string)"),
    (bad(lambda q, w: w.update(group_size=None)),
     "group_size is null, but strategy 'group' needs a positive group size"),
    (bad(lambda q, w: w.update(strategy="channel")),
     "strategy is 'channel' with group_size 64; set strategy \"group\" or drop group_size"),
    (bad(lambda q, w: w.update(strategy="block", group_size=None)),
     "the block strategy and a block_structure go together"),
    (bad(lambda q, w: w.update(symmetric="yes")), f"{WEIGHTS}.symmetric is \"yes\" (a string)"),
    (bad(lambda q, w: w.update(dynamic="sometimes")), f"{WEIGHTS}.dynamic is \"sometimes\""),
    (bad(lambda q, w: w.update(strategy="token", group_size=None)),
     "is false with strategy \"token\"; per-token scales are computed at run time"),
    (bad(lambda q, w: w.update(actorder="group", strategy="channel", group_size=None)),
     "group activation ordering takes strategy \"group\""),
    (bad(lambda q, w: q["config_groups"]["group_0"].update(targets="Linear")),
     "config_groups.group_0.targets is \"Linear\" (a string); write a list"),
    (bad(lambda q, w: q["config_groups"]["group_0"].update(input_activations=8)),
     "config_groups.group_0.input_activations is 8 (a number), not an object"),
    (bad(lambda q, w: q.update(config_groups={})), "config_groups is empty"),
    (bad(lambda q, w: q.update(ignore="lm_head")), "quantization_config.ignore is \"lm_head\""),
    (bad(lambda q, w: q.update(kv_cache_scheme={"type": "int", "num_bits": 8})),
     "quantization_config.kv_cache_scheme is int8/tensor; vLLM quantizes the KV cache to float 8 "
     "bits only"),
    (bad(lambda q, w: q.pop("quant_method")), "quantization_config.quant_method is missing"),
    ({}, "quantization_config is empty ({}); remove it for an unquantized model"),
    ([1], "quantization_config is [1] (a list), not an object"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "GPTQ takes 4 or 8 bits"),
    ({"quant_method": "gptq", "bits": 4}, "quantization_config.group_size is missing"),
    ({"quant_method": "awq", "w_bit": 8, "q_group_size": 128}, "w_bit is 8; AWQ takes 4 bits"),
    ({"quant_method": "fp8"}, "quantization_config.activation_scheme is missing"),
    ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]},
     "vLLM's block-wise fp8 takes \"dynamic\" only"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": 128},
     "weight_block_size is 128 (a number); write two positive integers"),
])
def test_what_they_refuse_is_named_with_its_field_and_value(qc, expected):
    assert expected in quantization_problem({"quantization_config": qc})


@pytest.mark.parametrize("value, expected", [
    (True, "quantgate_emulated is true (a boolean), not an object"),
    ("w4", "quantgate_emulated is \"w4\" (a string)"),
    ({"method": "dequantized"}, "quantgate_emulated.quantization_config is missing (or null)"),
    (emulated("w4", "w4a16"), "quantgate_emulated.quantization_config is \"w4a16\" (a string)"),
    (emulated("w4", bad(lambda q, w: w.update(num_bits=16))),
     "quantgate_emulated.quantization_config.config_groups.group_0.weights.num_bits is 16"),
])
def test_a_dequantized_twins_record_is_checked_as_its_source(value, expected):
    assert expected in quantization_problem({"quantgate_emulated": value})


def test_absent_or_null_is_unquantized():
    assert quantization_problem({}) is None
    assert quantization_problem({"quantization_config": None, "quantgate_emulated": None}) is None


@pytest.mark.parametrize("qc, expected", [
    (bad(lambda q, w: q.update(format="pack_quantized")),
     "quantization_config.format is \"pack_quantized\"; did you mean 'pack-quantized'?"),
    (bad(lambda q, w: q.update(format="Pack-Quantized")),
     "quantization_config.format is \"Pack-Quantized\"; did you mean 'pack-quantized'?"),
    (bad(lambda q, w: q["config_groups"]["group_0"].update(format="int4")),
     "quantization_config.config_groups.group_0.format is \"int4\""),
    (bad(lambda q, w: q.update(format=4)), "quantization_config.format is 4 (a number); write one "
     "of \"dense\""),
    (bad(lambda q, w: q.update(quantization_status="done")),
     "quantization_config.quantization_status is \"done\"; valid: calibration, compressed"),
    (bad(lambda q, w: q.update(sparsity_config="none")),
     "quantization_config.sparsity_config is \"none\" (a string), not an object; write {} or null"),
])
def test_the_names_compressed_tensors_reads_as_its_enums_are_checked(qc, expected):
    """vLLM parses these with compressed-tensors' own enums at start-up (exact spelling): an
    engine that will not start, found at validate."""
    assert expected in quantization_problem({"quantization_config": qc})


def test_empty_args_are_compressed_tensors_defaults_not_none():
    """QuantizationArgs() is 8-bit int per tensor: `weights: {}` quantizes, the axes say so."""
    from flows.axes import derive_axes

    qc = bad(lambda q, w: q["config_groups"]["group_0"].update(weights={}))
    assert quantization_config_problem(qc) is None
    assert derive_axes({"quantization_config": qc}, {}).weights == "int8/tensor"
