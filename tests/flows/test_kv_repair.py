"""A KV-cache repair served with engine flags: some layers' cache kept in the model dtype
(vLLM's --kv-cache-dtype-skip-layers), named by the kv_cache axis, checked against what the
engine reports, and planned as a repair stage beside the failed KV stage."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from flows.engines import kv_bytes_per_token
from flows.plan import plan
from flows.repair import _kv_served
from flows.served import Served, mismatches
from flows.spec import load_spec
from gates.repair import KvRepairOption
from infra.errors import SpecError
from infra.kv_axis import quantized_share, split_skipped, with_skipped
from infra.probe import cache_config, skip_layers
from infra.vllm_args import build_command
from tests.flows.checkpoints import make_demo_checkpoints

FIXTURES = Path(__file__).parent / "served"
LAYERS = 4


def write_spec(tmp_path: Path, kv_flags: dict) -> Path:
    models = make_demo_checkpoints(tmp_path / "models")
    for folder in models.values():  # a decoder of LAYERS layers, 2 KV heads of 16
        config = json.loads((folder / "config.json").read_text())
        config |= {"num_hidden_layers": LAYERS, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "hidden_size": 64}
        (folder / "config.json").write_text(json.dumps(config))
    spec = {
        "candidate": "kv", "baseline": {"checkpoint": str(models["bf16"])},
        "engine": {"kind": "vllm"},
        "stages": [{"name": "a8", "kind": "weights_activations", "checkpoint": str(models["w8a8"])},
                   {"name": "kv", "kind": "kv_cache", "engine_flags": kv_flags}],
        "evalsets": [{"name": "math", "limit": 60}], "load_profile": "ci",
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_axis_names_the_skipped_layers_and_the_command_asks_vllm_for_them(tmp_path):
    stages = plan(load_spec(write_spec(tmp_path, {"kv_cache_dtype": "fp8",
                                                  "kv_cache_dtype_skip_layers": [3, 0]})))
    kv = stages[-1]
    assert kv.axes.kv_cache == "fp8_e4m3/skip:0,3" and kv.changed == ["kv_cache"]
    command, _ = build_command(load_spec(tmp_path / "spec.yaml").engine, kv.checkpoint,
                               kv.engine_flags)
    at = command.index("--kv-cache-dtype-skip-layers")
    assert command[at + 1:at + 3] == ["0", "3"] and "--kv-cache-dtype" in command


@pytest.mark.parametrize(("flags", "message"), [
    ({"kv_cache_dtype_skip_layers": [0]}, "kv_cache_dtype is auto"),
    ({"kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": [4]}, r"\[4\]: the model has 4"),
    ({"kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": [0, 1, 2, 3]}, "every decoder layer"),
])
def test_skipped_layers_that_cannot_be_served_as_labelled_are_refused(tmp_path, flags, message):
    with pytest.raises(SpecError, match=message):
        plan(load_spec(write_spec(tmp_path, flags)))


def test_the_flag_in_extra_args_is_refused_for_the_typed_field(tmp_path):
    with pytest.raises(Exception, match="use engine_flags.kv_cache_dtype_skip_layers"):
        load_spec(write_spec(tmp_path, {"kv_cache_dtype": "fp8", "extra_args": [
            "--kv-cache-dtype-skip-layers", "0"]}))


def test_the_engine_s_own_list_is_read_and_checked_against_the_axis(tmp_path):
    metrics = (FIXTURES / "w8a8-kv-fp8.metrics").read_text()
    assert skip_layers(cache_config(metrics)["kv_cache_dtype_skip_layers"]) == []
    assert skip_layers("['0', '3']") == [0, 3]
    assert skip_layers("['sliding_window']") is None and skip_layers(None) is None
    kv = plan(load_spec(write_spec(tmp_path, {"kv_cache_dtype": "fp8",
                                              "kv_cache_dtype_skip_layers": [3]})))[-1]
    config = json.loads((kv.checkpoint / "config.json").read_text())
    ok = Served(cache_dtype="fp8", cache_skip_layers=[3])
    assert mismatches(kv, ok, config, external=True) == []
    wrong = Served(cache_dtype="fp8", cache_skip_layers=[])
    assert mismatches(kv, wrong, config, external=True) == [
        "stage kv keeps the model dtype on KV layers none but its axes say fp8_e4m3/skip:3"]


def test_the_kv_bytes_count_the_skipped_layers_in_the_model_dtype(tmp_path):
    kv = plan(load_spec(write_spec(tmp_path, {"kv_cache_dtype": "fp8",
                                              "kv_cache_dtype_skip_layers": [1]})))[-1]
    full = kv_bytes_per_token(kv.checkpoint, "auto", "bfloat16")
    fp8 = kv_bytes_per_token(kv.checkpoint, "fp8_e4m3", "bfloat16")
    assert (full, fp8) == (2 * LAYERS * 2 * 16 * 2, 2 * LAYERS * 2 * 16)
    assert kv_bytes_per_token(kv.checkpoint, kv.axes.kv_cache, "bfloat16") == fp8 + fp8 // LAYERS
    assert split_skipped(with_skipped("fp8_e4m3/calibrated", [2, 0])) == (
        "fp8_e4m3/calibrated", (0, 2))
    assert with_skipped("auto", [1]) == "auto" and quantized_share("fp8_e4m3/skip:1", 4) == 0.75


def _prepared(tmp_path: Path) -> SimpleNamespace:
    spec = load_spec(write_spec(tmp_path, {"kv_cache_dtype": "fp8"}))
    return SimpleNamespace(spec=spec, stages=plan(spec))


def test_the_repair_stage_is_the_failed_stage_with_its_costliest_layers_kept(tmp_path, monkeypatch):
    monkeypatch.setattr("flows.repair.cpu_flags", lambda: {"avx512f", "avx2"})
    prepared = _prepared(tmp_path)
    option = KvRepairOption(kv_cache="fp8_e4m3", skip_layers=[2], bytes=0)
    repaired = _kv_served(prepared, "kv-repair", "kv", option)
    stage = repaired.stages[-1]
    assert (stage.name, stage.kind, stage.parent) == ("kv-repair", "repair", "a8")
    assert stage.checkpoint == prepared.stages[-1].checkpoint
    assert stage.axes.kv_cache == option.axis == "fp8_e4m3/skip:2"
    assert stage.changed == ["kv_cache"] and stage.engine_flags.kv_cache_dtype == "fp8"
    assert [s.name for s in prepared.stages] == ["baseline", "a8", "kv"], "the run's plan is kept"


def test_a_box_that_cannot_serve_an_fp8_cache_gets_no_repair_stage(tmp_path, monkeypatch):
    monkeypatch.setattr("flows.repair.cpu_flags", lambda: {"avx2"})
    option = KvRepairOption(kv_cache="fp8_e4m3", skip_layers=[2], bytes=0)
    with pytest.raises(SpecError, match="kv-repair.*AVX-512"):
        _kv_served(_prepared(tmp_path), "kv-repair", "kv", option)


def test_an_e4m3_repair_of_an_e5m2_stage_switches_the_cache_flag(tmp_path, monkeypatch):
    monkeypatch.setattr("flows.repair.cpu_flags", lambda: {"avx512f"})
    spec = load_spec(write_spec(tmp_path, {"kv_cache_dtype": "fp8_e5m2"}))
    prepared = SimpleNamespace(spec=spec, stages=plan(spec))
    option = KvRepairOption(kv_cache="fp8_e4m3", skip_layers=[], bytes=0)
    stage = _kv_served(prepared, "kv-repair", "kv", option).stages[-1]
    assert stage.engine_flags.kv_cache_dtype == "fp8_e4m3" and stage.axes.kv_cache == "fp8_e4m3"
    assert not stage.engine_flags.kv_cache_dtype_skip_layers
