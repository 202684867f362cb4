"""Tests for the emulated weight formats: definitions, naming, the grouping rule, the bit-for-bit check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infra.formats import (
    FORMATS,
    WeightFormat,
    bitwise_mismatches,
    calibration_files,
    layers_left_unquantized,
    unknown_formats_message,
)

REPO = Path(__file__).resolve().parents[2]
# SmolLM2-135M's Linear input widths: attention and gate/up read the 576-wide hidden state,
# down_proj reads the 1536-wide MLP state.
SMOLLM2_WIDTHS = {
    "model.layers.0.self_attn.q_proj": 576,
    "model.layers.0.self_attn.k_proj": 576,
    "model.layers.0.self_attn.v_proj": 576,
    "model.layers.0.self_attn.o_proj": 576,
    "model.layers.0.mlp.gate_proj": 576,
    "model.layers.0.mlp.up_proj": 576,
    "model.layers.0.mlp.down_proj": 1536,
}


def test_every_format_the_issue_asks_for_is_defined() -> None:
    assert set(FORMATS) == {
        "nvfp4",
        "mxfp4",
        "int4-g32-rtn",
        "int4-g32-gptq",
        "int4-g128-rtn",
        "int4-g128-gptq",
        "fp8-tensor",
        "fp8-channel",
        "fp8-block",
    }


def test_fp4_formats_use_compressed_tensors_own_presets() -> None:
    assert (FORMATS["nvfp4"].preset, FORMATS["nvfp4"].group_size) == ("NVFP4A16", 16)
    assert (FORMATS["mxfp4"].preset, FORMATS["mxfp4"].group_size) == ("MXFP4A16", 32)


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_int4_formats_are_symmetric_groups(group: int, method: str) -> None:
    fmt = FORMATS[f"int4-g{group}-{method}"]
    assert fmt.method == method
    assert fmt.group_size == group
    assert dict(fmt.weights) == {
        "num_bits": 4,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": group,
    }


def test_fp8_formats_differ_only_in_scale_granularity() -> None:
    strategies = {name: dict(FORMATS[name].weights) for name in ("fp8-tensor", "fp8-channel", "fp8-block")}
    assert {n: w.pop("strategy") for n, w in strategies.items()} == {
        "fp8-tensor": "tensor",
        "fp8-channel": "channel",
        "fp8-block": "block",
    }
    assert strategies["fp8-block"].pop("block_structure") == [128, 128]
    assert all(w == {"num_bits": 8, "type": "float", "symmetric": True} for w in strategies.values())
    assert all(FORMATS[n].group_size is None and FORMATS[n].method == "rtn" for n in strategies)


def test_names_are_unique_and_twins_are_marked() -> None:
    names = [n for f in FORMATS.values() for n in (f.candidate(), f.twin())]
    assert len(names) == len(set(names))
    assert FORMATS["nvfp4"].candidate() == "smollm2-135m-nvfp4"
    assert FORMATS["nvfp4"].twin() == "smollm2-135m-nvfp4-dequant"


def test_a_format_needs_exactly_one_scheme_source_and_a_known_method() -> None:
    with pytest.raises(ValueError, match="exactly one of preset and weights"):
        WeightFormat("both", "x", preset="NVFP4A16", weights={"num_bits": 4})
    with pytest.raises(ValueError, match="exactly one of preset and weights"):
        WeightFormat("neither", "x")
    with pytest.raises(ValueError, match=r"method 'awq' is not one of \('rtn', 'gptq'\)"):
        WeightFormat("awq", "x", preset="W4A16", method="awq")


def test_unknown_format_message_suggests_and_lists() -> None:
    assert unknown_formats_message(["nvfp4", "fp8-block"]) is None
    message = unknown_formats_message(["nvfp4", "mxfp44", "bogus"])
    assert message.startswith("unknown format 'mxfp44' (did you mean 'mxfp4'?), 'bogus'; known formats: ")
    assert all(name in message for name in FORMATS)
    assert "\n" not in message


def test_group_128_quantizes_only_the_down_projections_of_smollm2() -> None:
    left = layers_left_unquantized(SMOLLM2_WIDTHS, 128)
    assert left == sorted(n for n in SMOLLM2_WIDTHS if not n.endswith("down_proj"))
    for group in (16, 32, 64):
        assert layers_left_unquantized(SMOLLM2_WIDTHS, group) == []
    assert layers_left_unquantized(SMOLLM2_WIDTHS, None) == []


def test_calibration_text_is_the_repos_prose_not_the_scored_eval_items() -> None:
    files = calibration_files(REPO)
    assert REPO / "README.md" in files
    assert all(f.suffix == ".md" for f in files)
    assert not any(
        part == "models" or part.startswith(".") for f in files for part in f.relative_to(REPO).parts
    )
    assert sum(len(f.read_text()) for f in files) > 20_000  # enough for 64 windows of 256 tokens


def _weights() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "model.layers.0.mlp.down_proj.weight": torch.randn(8, 16, generator=generator).bfloat16(),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(4, 4, generator=generator).bfloat16(),
    }


def test_identical_weights_pass_the_bit_check() -> None:
    expected = _weights()
    assert bitwise_mismatches(expected, {k: v.clone() for k, v in expected.items()}) == []


def test_a_planted_one_bit_difference_is_caught() -> None:
    expected = _weights()
    actual = {k: v.clone() for k, v in expected.items()}
    actual["model.layers.0.mlp.down_proj.weight"].view(torch.int16)[3, 5] ^= 1  # lowest mantissa bit
    assert torch.allclose(actual["model.layers.0.mlp.down_proj.weight"].float(),
                          expected["model.layers.0.mlp.down_proj.weight"].float(), rtol=1e-2)
    assert bitwise_mismatches(expected, actual) == [
        "model.layers.0.mlp.down_proj.weight: 1 of 128 values differ"
    ]


def test_signed_zero_missing_layers_and_wrong_dtype_are_caught() -> None:
    expected = {"a.weight": torch.zeros(2, 2, dtype=torch.bfloat16), "b.weight": torch.ones(2)}
    actual = {"a.weight": -torch.zeros(2, 2, dtype=torch.bfloat16)}
    assert bitwise_mismatches(expected, actual) == ["a.weight: 4 of 4 values differ", "b.weight: missing"]
    wrong_dtype = {"a.weight": torch.zeros(2, 2), "b.weight": torch.ones(2)}
    assert bitwise_mismatches(expected, wrong_dtype) == [
        "a.weight: torch.float32 (2, 2), expected torch.bfloat16 (2, 2)"
    ]
