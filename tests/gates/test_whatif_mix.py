"""Where a mixed compressed-tensors checkpoint puts each format (gates.whatif.mix, flows.axes)."""

from __future__ import annotations

import pytest

from flows.axes import weight_mix
from gates.whatif.mix import decoder_matmuls, module_groups
from gates.whatif.shape import ModelShape

# SmolLM2-135M's shape: 30 layers, hidden 576, 9 heads and 3 KV heads of 64, MLP 1536.
SHAPE = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
         "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152}
LAYER = 576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536
INT4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 16, "symmetric": True}
INT8 = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}


def config(groups: dict, ignore: list[str] | None = None) -> dict:
    return SHAPE | {"quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "ignore": ignore or ["lm_head"], "config_groups": groups}}


def test_each_decoder_matmul_is_counted_once_with_its_weights():
    counts = decoder_matmuls(ModelShape.from_config(SHAPE))
    assert len(counts) == 30 * 7 and sum(counts.values()) == 30 * LAYER
    assert counts["model.layers.0.self_attn.k_proj"] == 576 * 192


def test_an_exact_name_beats_a_pattern_which_beats_linear_and_ignore_beats_all():
    qc = config({"a": {"targets": ["Linear"], "weights": INT4},
                 "b": {"targets": [r"re:.*\.down_proj$"], "weights": INT8},
                 "c": {"targets": ["model.layers.3.mlp.down_proj"], "weights": INT8}},
                ignore=["lm_head", r"re:model\.layers\.29\..*"])["quantization_config"]
    groups = module_groups(qc, ModelShape.from_config(SHAPE))
    assert groups["model.layers.0.self_attn.q_proj"] == "a"
    assert groups["model.layers.0.mlp.down_proj"] == "b"
    assert groups["model.layers.3.mlp.down_proj"] == "c"
    assert groups["model.layers.29.mlp.down_proj"] is None


def test_the_mix_is_each_formats_share_of_the_weights():
    kept = [r"re:.*\.down_proj$", r"re:.*\.up_proj$"]
    mix = weight_mix(config({"group_0": {"targets": ["Linear"], "weights": INT4},
                             "group_1": {"targets": kept, "weights": INT8}}))
    share = 2 * 576 * 1536 / LAYER
    assert mix == pytest.approx({"int4/group16": 1 - share, "int8/channel": share}, abs=1e-6)
    # Layers left in bf16 (the repair's `kept_as: bf16`) are a format of their own.
    bf16 = weight_mix(config({"group_0": {"targets": ["Linear"], "weights": INT4}},
                             ignore=["lm_head", r"re:model\.layers\.(11|29)\..*"]))
    assert bf16 == pytest.approx({"int4/group16": 28 / 30, "none": 2 / 30}, abs=1e-6)


@pytest.mark.parametrize("groups", [
    {"group_0": {"targets": ["Linear"], "weights": INT4}},  # one format: no mix
    # Targets named for another model's modules: where the formats go is unknown.
    {"group_0": {"targets": ["Linear"], "weights": INT4},
     "group_1": {"targets": ["transformer.h.0.mlp.c_fc"], "weights": INT8}},
    {"group_0": {"targets": ["Linear"], "weights": INT4},
     "group_1": {"targets": ["re:(unclosed"], "weights": INT8}},
])
def test_no_mix_is_given_where_there_is_none_or_it_cannot_be_placed(groups):
    assert weight_mix(config(groups)) is None


def test_a_dequantized_twin_gives_the_mix_of_the_checkpoint_it_was_made_from():
    qc = config({"group_0": {"targets": ["Linear"], "weights": INT4},
                 "group_1": {"targets": [r"re:.*\.down_proj$"], "weights": INT8}})
    twin = SHAPE | {"quantgate_emulated": {"method": "dequantized",
                                           "quantization_config": qc["quantization_config"]}}
    assert weight_mix(twin) == weight_mix(qc) is not None
