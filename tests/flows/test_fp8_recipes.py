"""The seed's FP8 recipes as stages: online FP8 after a weights-only FP8 stage, or declared as
the coupled change; FP8 KV cache dtypes in the axes; flags that quantize nothing refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.axes import derive_axes
from flows.plan import plan
from flows.spec import Spec
from infra.errors import SpecError
from tests.flows.checkpoints import compressed_tensors, make_checkpoint

# A compressed-tensors FP8 weight-only checkpoint (`quantgate prepare-candidates fp8-tensor`).
FP8_WEIGHTS = compressed_tensors({"num_bits": 8, "type": "float", "symmetric": True,
                                  "strategy": "tensor"})


def spec(tmp_path: Path, stages: list[dict], device: str = "cuda") -> Spec:
    base = make_checkpoint(tmp_path / "bf16")
    w8 = make_checkpoint(tmp_path / "fp8-tensor", FP8_WEIGHTS)
    for stage in stages:
        if stage.get("checkpoint") == "W8":
            stage["checkpoint"] = str(w8)
        elif stage.get("checkpoint") == "BASE":
            stage["checkpoint"] = str(base)
    return Spec.model_validate({"candidate": "c", "baseline": {"checkpoint": str(base)},
                                "engine": {"device": device}, "stages": stages,
                                "evalsets": [{"name": "math", "limit": 40}]})


def online_fp8(**flags) -> dict:
    return {"quantization": "fp8", **flags}


def test_online_fp8_after_a_weights_only_fp8_stage_keeps_one_change_per_stage(tmp_path):
    stages = plan(spec(tmp_path, [
        {"name": "w8", "kind": "weights", "checkpoint": "W8"},
        {"name": "a8", "kind": "activations", "checkpoint": "BASE", "engine_flags": online_fp8()},
        {"name": "kv", "kind": "kv_cache", "engine_flags": {"kv_cache_dtype": "fp8_e4m3"}},
    ]))
    assert [(s.name, s.changed) for s in stages[1:]] == [
        ("w8", ["weights"]), ("a8", ["activations"]), ("kv", ["kv_cache"])]
    # CUDA vLLM with CUTLASS quantizes online FP8 activations per token, and so says the label.
    assert stages[2].axes.activations == "float8/token/dynamic"
    assert stages[3].axes.kv_cache == "fp8_e4m3"


def test_the_seed_recipe_in_one_stage_is_refused_with_the_ways_to_run_it(tmp_path):
    with pytest.raises(SpecError, match=r"changes 2 axes .* put a weights-only stage before it "
                       r".*prepare-candidates fp8-tensor.*declare kind weights_activations"):
        plan(spec(tmp_path, [{"name": "fp8", "kind": "weights", "engine_flags": online_fp8()}]))
    # `--quantization fp8 --kv-cache-dtype fp8` at once moves three axes.
    with pytest.raises(SpecError, match="changes 3 axes .* declare kind weights_activations to "
                       "accept weights and activations at once; and the kv_cache change in a "
                       "stage of its own after it"):
        plan(spec(tmp_path, [{"name": "fp8", "kind": "weights",
                              "engine_flags": online_fp8(kv_cache_dtype="fp8")}]))
    with pytest.raises(SpecError, match=r"changes 2 axes .*\(weights: none -> float8/tensor; "
                       r"kv_cache: auto -> fp8_e4m3\).* split it into one stage per axis"):
        plan(spec(tmp_path, [{"name": "w8kv", "kind": "weights", "checkpoint": "W8",
                              "engine_flags": {"kv_cache_dtype": "fp8"}}]))
    with pytest.raises(SpecError, match="move the kv_cache change to a stage of its own after it"):
        plan(spec(tmp_path, [{"name": "fp8", "kind": "weights_activations",
                              "engine_flags": online_fp8(kv_cache_dtype="fp8")}]))


def test_the_coupled_change_declared_on_purpose_is_one_stage_of_two_axes(tmp_path):
    stages = plan(spec(tmp_path, [
        {"name": "w8a8", "kind": "weights_activations", "engine_flags": online_fp8()},
        {"name": "kv", "kind": "kv_cache", "engine_flags": {"kv_cache_dtype": "fp8"}},
    ]))
    assert stages[1].changed == ["weights", "activations"]
    assert (stages[1].axes.weights, stages[1].axes.activations) == (
        "float8/tensor", "float8/token/dynamic")
    assert stages[2].changed == ["kv_cache"]
    # Declared coupled, but only the weights move: the label is refused.
    with pytest.raises(SpecError, match="declared kind 'weights_activations' .* changes weights"):
        plan(spec(tmp_path, [{"name": "w8", "kind": "weights_activations", "checkpoint": "W8"}]))


def test_newer_online_names_are_known_and_a_typo_gets_the_closest(tmp_path):
    bf16 = {"dtype": "bfloat16"}
    assert derive_axes(bf16, {"quantization": "fp8_per_tensor"}, "cuda").activations == \
        "float8/token/dynamic"
    mx = derive_axes(bf16, {"quantization": "mxfp8"}, "cuda")
    assert (mx.weights, mx.activations) == ("mxfp8/group32", "mxfp8/group32/dynamic")
    with pytest.raises(SpecError, match="did you mean 'fp8_per_tensor'"):
        derive_axes(bf16, {"quantization": "fp8_per_tensr"}, "cuda")


def test_vllm_cpu_labels_are_unchanged():
    axes = derive_axes({"dtype": "bfloat16"}, {"quantization": "fp8"})
    assert axes.activations == "float8/tensor/dynamic"


def test_int8_weight_only_that_quantizes_nothing_on_a_dense_model_is_refused(tmp_path):
    with pytest.raises(SpecError, match=r"quantizes MoE experts only .* this model has no "
                       r"experts .* serve an INT8 weight-only checkpoint"):
        plan(spec(tmp_path, [{"name": "w8", "kind": "weights",
                              "engine_flags": {"quantization": "int8_per_channel_weight_only"}}]))
    moe = {"dtype": "bfloat16", "text_config": {"num_experts": 128}}
    axes = derive_axes(moe, {"quantization": "int8_per_channel_weight_only"}, "cuda")
    assert axes.weights == "int8/channel/experts"


def test_fp8_kv_cache_dtypes_are_recorded_in_the_axes(tmp_path):
    for flag, axis in (("fp8", "fp8_e4m3"), ("fp8_e4m3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2")):
        stages = plan(spec(tmp_path / flag, [
            {"name": "kv", "kind": "kv_cache", "engine_flags": {"kv_cache_dtype": flag}}]))
        assert stages[1].axes.kv_cache == axis and stages[1].changed == ["kv_cache"]
    config = json.loads((tmp_path / "fp8" / "bf16" / "config.json").read_text())
    assert "quantization_config" not in config  # default scales: the checkpoint carries none


def test_fp8_activations_run_through_the_marlin_fallback_are_not_measured_as_w8a8(tmp_path):
    from flows.served import kernel_mismatches
    from infra.engine import EngineFacts

    stages = plan(spec(tmp_path, [
        {"name": "w8", "kind": "weights", "checkpoint": "W8"},
        {"name": "a8", "kind": "activations", "checkpoint": "BASE", "engine_flags": online_fp8()}]))
    # An A100's log: "Your GPU does not have native support for FP8 computation ..." (vLLM's
    # marlin_utils_fp8.py), read into the facts by infra/vllm_facts.py.
    a100 = EngineFacts(base_url="http://x", model="m", fp8_marlin_fallback=True)
    assert kernel_mismatches(stages[2], a100) == [
        "stage a8: vLLM ran its FP8 weights through the Marlin fallback (this GPU has no FP8 "
        "units: weights only, activations unquantized) but its axes say activations "
        "float8/token/dynamic; serve it on a GPU with FP8 (sm89+: L40S, H100, B200), or measure "
        "a weights stage there instead"]
    # The weights-only FP8 stage is weight-only on any kernel (Marlin on an A100; on an H200
    # vLLM 0.25 picks Humming): what its label says.
    assert kernel_mismatches(stages[1], a100) == []
    assert kernel_mismatches(stages[2], EngineFacts(base_url="http://x", model="m")) == []


def test_calibrated_kv_scales_are_told_apart_from_the_default_ones(tmp_path):
    from flows.served import Served, mismatches

    calibrated = dict(FP8_WEIGHTS, kv_cache_scheme={"type": "float", "num_bits": 8,
                                                   "strategy": "tensor"})
    scaled = make_checkpoint(tmp_path / "fp8-kv-scales", calibrated)
    stages = plan(spec(tmp_path, [
        {"name": "w8", "kind": "weights", "checkpoint": "W8"},
        {"name": "kv", "kind": "kv_cache", "engine_flags": {"kv_cache_dtype": "fp8"}},
        {"name": "kv-cal", "kind": "kv_cache", "checkpoint": str(scaled)}]))
    assert [s.axes.kv_cache for s in stages] == ["auto", "auto", "fp8_e4m3", "fp8_e4m3/calibrated"]
    # Default scales (1.0) -> calibrated: one change, of the KV cache.
    assert stages[3].changed == ["kv_cache"]
    # The engine reports the cache dtype only; the scales are the checkpoint's.
    assert mismatches(stages[3], Served(cache_dtype="fp8"), {}, external=True) == []
