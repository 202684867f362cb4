"""The repair options a diagnosis weighs (gates.repair) and a repair stage's own verdict."""

from __future__ import annotations

import math

import pytest

from gates.decide import decide, repair_verdicts
from gates.diagnosis import Diagnosis
from gates.policy import GatePolicy
from gates.repair import (
    TARGET_SHARE,
    LayerParams,
    RepairOption,
    chosen,
    options,
    passes,
    target_kl,
    weight_bytes,
)
from gates.whatif.shape import ModelShape
from tests.gates.records import record

KINDS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# SmolLM2-135M's shapes: 30 layers, hidden 576, 3 KV heads of 64, MLP 1536, 49,152 x 576 tied.
IN = [576, 576, 576, 576, 576, 576, 1536]
OUT = [576, 192, 192, 576, 1536, 1536, 576]
PARAMS = LayerParams(kinds=KINDS, in_features=[IN] * 30, out_features=[OUT] * 30,
                     other=49152 * 576 + 61 * 576)
BASE = [1.0, 0.0] * 30
SMOLLM2 = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
           "tie_word_embeddings": True}  # config.json's shape keys


def test_bytes_count_each_format_with_its_scales():
    linear = sum(i * o for i, o in zip(IN, OUT, strict=True))
    bf16 = weight_bytes(PARAMS, RepairOption(weights="bf16", bytes=0))
    assert bf16 == 2 * (30 * linear + PARAMS.other)
    int4 = weight_bytes(PARAMS, RepairOption(weights="int4/group64", bytes=0))
    scales = 30 * sum(o * math.ceil(i / 64) for i, o in zip(IN, OUT, strict=True))
    assert int4 == (4 * 30 * linear + 16 * scales + 16 * PARAMS.other) // 8
    one_kept = weight_bytes(PARAMS, RepairOption(weights="int4/group64", kept_layers=[3], bytes=0))
    assert one_kept - int4 == (16 * linear - (4 * linear + 16 * scales // 30)) // 8


def test_options_come_cheapest_first_and_leave_out_the_failed_configuration():
    found = options(PARAMS, "int4/group64", layer_ranking=[29, 11, 12], kind_ranking=KINDS[::-1])
    sizes = [o.bytes for o in found]
    assert sizes == sorted(sizes)
    assert not any(o.weights == "int4/group64" and not o.kept_layers and not o.kept_kinds
                   for o in found)
    assert {o.weights for o in found} == {"int4/group64", "int4/group32", "int4/group16",
                                          "int8/channel"}
    # The costliest layers are kept first; module kinds likewise, from the ranking given.
    assert any(o.kept_layers == [29] and o.kept_as == "bf16" for o in found)
    assert any(o.kept_layers == [11, 29] and o.kept_as == "int8/channel" for o in found)
    assert any(o.kept_kinds == ["down_proj", "up_proj"] for o in found)
    # Keeping a layer in int8 costs less than keeping it in bf16.
    as_int8, as_bf16 = (next(o for o in found if o.kept_layers == [29] and o.kept_as == kept_as
                             and o.weights == "int4/group64") for kept_as in ("int8/channel", "bf16"))
    assert as_int8.bytes < as_bf16.bytes and found[-1].weights in ("int8/channel", "int4/group16")


def test_a_plain_format_close_in_bytes_is_chosen_over_a_mixed_one():
    def option(bytes_: int, kl: float, **kept) -> RepairOption:
        return RepairOption(weights="int8/channel" if not kept else "int4/group16", bytes=bytes_,
                            mean_kl=kl, ci_low=kl, ci_high=kl, target=0.02, **kept)

    mixed = option(100, 0.018, kept_kinds=["down_proj"])
    near, far, failing = option(104, 0.003), option(110, 0.003), option(99, 0.03, kept_layers=[1])
    assert chosen([failing, mixed, near])[0] is near
    best, why = chosen([failing, mixed, far])
    assert best is mixed and "cheapest" in why
    assert chosen([failing]) == (None, "no option measured lies under its target")


def test_the_target_is_the_tighter_of_the_kl_and_perplexity_limits():
    policy = GatePolicy()
    target, why = target_kl(policy, "4bit")
    assert target == TARGET_SHARE * min(policy.tolerance("4bit").max_kl,
                                        math.log1p(policy.perplexity.max_increase_vs_parent))
    assert why
    option = RepairOption(weights="int4/group32", bytes=1, mean_kl=0.01, ci_low=0.005,
                          ci_high=target * 1.01, target=target)
    assert not passes(option)
    assert passes(option.model_copy(update={"ci_high": target * 0.99}))
    assert not passes(RepairOption(weights="int4/group32", bytes=1))  # not measured


def test_the_target_leaves_out_what_the_parent_spent_against_the_baseline():
    """The divergence rule reads the stage against the baseline; the option's emulated KL is
    what it adds over its parent's formats: the parent's served KL comes off the limit first
    (the demo's FP8 KV stage on AVX-512 sits on W8A8 at KL up to 0.0246 of the 0.03)."""
    policy = GatePolicy()
    limit = policy.tolerance("8bit").max_kl
    target, why = target_kl(policy, "8bit", spent=0.0246, parent="activations")
    assert target == pytest.approx(TARGET_SHARE * (limit - 0.0246))
    assert target < target_kl(policy, "8bit")[0]
    assert "parent activations spends" in why and "0.0246" in why
    assert target_kl(policy, "8bit", spent=limit * 1.2)[0] == 0.0
    assert target_kl(policy, "8bit", spent=0.0) == target_kl(policy, "8bit")


def test_a_repair_stage_gets_its_own_verdict_and_never_turns_the_candidates():
    baseline = record("baseline", None, BASE)
    failed = record("w4", "baseline", BASE, perplexity=14.0)
    good_repair = record("w4-repair", "baseline", BASE, kind="repair")
    policy = GatePolicy()
    verdict = decide("c", [baseline, failed, good_repair], policy)
    # The candidate is w4, never the repair: its rollback stands, and the repair is no target.
    assert verdict.decision == "rollback" and verdict.accepted_stage == "baseline"
    assert all(r.startswith("w4: ") for r in verdict.reasons)
    diagnosis = Diagnosis(stage="w4", parent="baseline", failed_rules=["perplexity.parent"],
                          checkpoint="", reference="", emulated={"weights": "int4/group64"},
                          weight_bytes=100, repair_stage="w4-repair",
                          repair=RepairOption(weights="int4/group32", kept_layers=[29], bytes=120))
    # The speed each would ship at, predicted from its shape and format: the repair (INT4 with a
    # layer kept in bf16, a mixed checkpoint) between the failed INT4 stage and the baseline.
    baseline.shape = failed.shape = good_repair.shape = SMOLLM2
    failed.axes = good_repair.axes = baseline.axes | {"weights": "int4/group64"}
    good_repair.weight_mix = {"int4/group32": 29 / 30, "none": 1 / 30}
    (judged,) = repair_verdicts("c", [baseline, failed, good_repair], policy, {"w4": diagnosis})
    assert judged.decision == "go" and judged.repairs == "w4", judged.reasons
    assert judged.configuration == "int4/group32, layers 29 as bf16"
    assert (judged.weight_bytes, judged.failed_weight_bytes) == (120, 100)
    assert judged.predicted_on and set(judged.tpot_ms) == {"w4-repair", "w4", "baseline"}
    assert judged.tpot_ms["w4"] < judged.tpot_ms["w4-repair"] < judged.tpot_ms["baseline"]
    bad_repair = record("w4-repair", "baseline", BASE, kind="repair", perplexity=14.0)
    (judged,) = repair_verdicts("c", [baseline, failed, bad_repair], policy, {"w4": diagnosis})
    assert judged.decision == "rollback" and judged.reasons[0].startswith("w4-repair: ")
    # A failing repair does not block a candidate that passes (a re-gate by a looser policy).
    passing = record("w4", "baseline", BASE)
    assert decide("c", [baseline, passing, bad_repair], policy).decision == "go"


def test_kv_options_keep_the_costliest_layers_first_and_never_every_layer():
    from gates.repair import kv_bytes, kv_families
    from infra.kv_axis import with_skipped

    shape = ModelShape.from_config(SMOLLM2)
    assert kv_bytes(shape, "fp8_e4m3") == 2 * 30 * 3 * 64
    assert kv_bytes(shape, with_skipped("fp8_e4m3", [4, 4])) == 2 * 31 * 3 * 64
    ranking = [7, 0, 3, *[layer for layer in range(30) if layer not in (7, 0, 3)]]
    (found,) = kv_families(shape, "fp8_e4m3", ranking)
    assert [len(o.skip_layers) for o in found] == [1, 2, 3, 4, 6, 8, 12, 16, 20, 24]
    assert found[0].skip_layers == [7] and found[2].skip_layers == [0, 3, 7]
    assert [o.bytes for o in found] == sorted(o.bytes for o in found)
    assert found[1].axis == "fp8_e4m3/skip:0,7" and found[1].name.endswith("layers 0, 7")
    # A stage that already skips layers is repaired on top of them, never with fewer.
    (again,) = kv_families(shape, "fp8_e4m3/calibrated/skip:29", ranking)
    assert again[0].kv_cache == "fp8_e4m3/calibrated" and again[0].skip_layers == [7, 29]
    one_layer = ModelShape.from_config(SMOLLM2 | {"num_hidden_layers": 1})
    assert kv_families(one_layer, "fp8_e4m3", [0]) == []


def test_a_failed_e5m2_cache_is_offered_e4m3_in_its_own_bytes_first():
    from gates.repair import kv_families

    shape = ModelShape.from_config({"hidden_size": 64, "num_hidden_layers": 4,
                                    "num_attention_heads": 4, "num_key_value_heads": 2,
                                    "head_dim": 16, "intermediate_size": 128, "vocab_size": 96})
    switch, e5m2, e4m3 = kv_families(shape, "fp8_e5m2", [2, 1, 0, 3])
    assert [(o.kv_cache, o.skip_layers, o.bytes) for o in switch] == [
        ("fp8_e4m3", [], 2 * 4 * 2 * 16)]
    assert switch[0].name == "fp8_e4m3 KV cache" and switch[0].axis == "fp8_e4m3"
    assert {o.kv_cache for o in e5m2} == {"fp8_e5m2"} and {o.kv_cache for o in e4m3} == {"fp8_e4m3"}
    assert [o.skip_layers for o in e4m3] == [[2], [1, 2], [0, 1, 2]]
