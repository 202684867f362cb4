from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows.plan import plan
from flows.spec import load_spec
from infra.errors import CheckpointError, SpecError
from tests.flows.checkpoints import make_demo_checkpoints

REPO = Path(__file__).resolve().parents[2]


def write_spec(tmp_path: Path, **overrides) -> Path:
    models = make_demo_checkpoints(tmp_path / "models")
    spec = {
        "candidate": "demo",
        "baseline": {"checkpoint": str(models["bf16"])},
        "stages": [
            {"name": "weights", "kind": "weights", "checkpoint": str(models["w8a16"])},
            {"name": "activations", "kind": "activations", "checkpoint": str(models["w8a8"])},
            {"name": "kv", "kind": "kv_cache", "engine_flags": {"kv_cache_dtype": "fp8"}},
        ],
        "evalsets": [{"name": "math", "limit": 60}],
        "load_profile": "ci",
    }
    spec.update(overrides)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_demo_chain_plans_one_axis_per_stage(tmp_path):
    stages = plan(load_spec(write_spec(tmp_path)))
    assert [s.name for s in stages] == ["baseline", "weights", "activations", "kv"]
    assert [s.changed for s in stages] == [[], ["weights"], ["activations"], ["kv_cache"]]
    kv = stages[-1]
    assert kv.checkpoint.name == "w8a8", "a stage without a checkpoint inherits its parent's"
    assert kv.engine_flags.kv_cache_dtype == "fp8"
    assert kv.axes.kv_cache == "fp8_e4m3"


def test_relative_checkpoints_resolve_against_the_spec_file(tmp_path):
    make_demo_checkpoints(tmp_path / "models")
    path = write_spec(tmp_path, baseline={"checkpoint": "models/bf16"})
    assert load_spec(path).baseline.checkpoint == (tmp_path / "models" / "bf16").resolve()


def test_stage_changing_two_axes_is_refused_with_the_axes_named(tmp_path):
    models = make_demo_checkpoints(tmp_path / "models")
    path = write_spec(tmp_path, stages=[
        {"name": "both", "kind": "weights", "checkpoint": str(models["w8a8"])},
    ])
    with pytest.raises(SpecError, match=r"changes 2 axes.*weights: none -> int8/channel.*activations"):
        plan(load_spec(path))


def test_stage_changing_nothing_is_refused(tmp_path):
    models = make_demo_checkpoints(tmp_path / "models")
    path = write_spec(tmp_path, stages=[
        {"name": "same", "kind": "weights", "checkpoint": str(models["bf16"])},
    ])
    with pytest.raises(SpecError, match="changes no axis"):
        plan(load_spec(path))


def test_a_control_stage_serves_its_parent_again(tmp_path):
    models = make_demo_checkpoints(tmp_path / "models")
    stages = plan(load_spec(write_spec(tmp_path, stages=[
        {"name": "control", "kind": "control", "parent": "baseline"},
        {"name": "w8", "kind": "weights", "parent": "baseline", "checkpoint": str(models["w8a16"])},
    ])))
    control = stages[1]
    assert control.kind == "control" and control.parent == "baseline" and control.changed == []
    assert control.axes == stages[0].axes and control.checkpoint == stages[0].checkpoint
    assert control.engine_flags == stages[0].engine_flags


def test_a_control_stage_with_its_own_checkpoint_or_flags_is_refused(tmp_path):
    models = make_demo_checkpoints(tmp_path / "models")
    for extra in ({"checkpoint": str(models["w8a16"])}, {"engine_flags": {"kv_cache_dtype": "fp8"}}):
        with pytest.raises(SpecError, match="is a control: it serves its parent's exact"):
            load_spec(write_spec(tmp_path, stages=[{"name": "c", "kind": "control", **extra}]))


def test_label_that_disagrees_with_the_checkpoint_is_refused(tmp_path):
    models = make_demo_checkpoints(tmp_path / "models")
    path = write_spec(tmp_path, stages=[
        {"name": "w", "kind": "activations", "checkpoint": str(models["w8a16"])},
    ])
    with pytest.raises(SpecError, match="declared kind 'activations' but what it serves changes weights"):
        plan(load_spec(path))


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"stages": [{"name": "x", "kind": "weightz"}]}, r"field 'stages.0.kind'.*'weights'"),
        ({"engine": {"kind": "tgi"}}, r"field 'engine': 'tgi' is not one of its choices; valid: "
                                      r"external, sglang, vllm"),
        ({"evalsets": [{"name": "maths"}]}, r"unknown eval set 'maths'.*did you mean 'math'"),
        ({"stages": [{"name": "w", "kind": "weights", "parent": "nope"}]}, "parent 'nope'"),
        ({"colour": "red"}, r"field 'colour'"),
        ({"chat_templat": True}, r"unknown field 'chat_templat'; did you mean 'chat_template'"),
        ({"engine": {"kind": "vllm", "prot": 1}}, r"unknown field 'engine.vllm.prot'; did you mean 'port'"),
        ({"stages": [{"name": "w", "kind": "weights", "checkpont": "x"}]},
         r"unknown field 'stages.0.checkpont'; did you mean 'checkpoint'"),
    ],
)
def test_bad_spec_names_file_and_field(tmp_path, overrides, needle):
    path = write_spec(tmp_path, **overrides)
    with pytest.raises(SpecError, match=needle) as info:
        load_spec(path)
    assert str(path) in str(info.value)


def test_missing_field_is_named(tmp_path):
    path = write_spec(tmp_path)
    data = yaml.safe_load(path.read_text())
    del data["baseline"]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="field 'baseline': Field required"):
        load_spec(path)


def test_missing_spec_file_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="file not found"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("candidate: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)


def test_missing_or_non_model_checkpoint(tmp_path):
    path = write_spec(tmp_path, baseline={"checkpoint": str(tmp_path / "absent")})
    with pytest.raises(CheckpointError, match="absent does not exist"):
        plan(load_spec(path))
    (tmp_path / "empty").mkdir()
    path = write_spec(tmp_path, baseline={"checkpoint": str(tmp_path / "empty")})
    with pytest.raises(CheckpointError, match="not a model: no config.json"):
        plan(load_spec(path))


@pytest.mark.parametrize("name", ["demo.yaml", "demo-avx2.yaml", "demo-w4a16.yaml", "demo-w4a16-avx2.yaml"])
def test_bundled_demo_specs_parse(name):
    spec = load_spec(REPO / "flows" / "specs" / name)
    weights = next(stage for stage in spec.stages if stage.kind == "weights")
    assert weights.parent == "baseline"
    assert all(stage.parent == "baseline" for stage in spec.stages if stage.kind == "control")


def test_sets_too_small_for_the_accuracy_gate_are_refused_with_the_items_needed(tmp_path):
    from flows.preflight import Prepared

    small = write_spec(tmp_path, stages=[{"name": "control", "kind": "control"}],
                       evalsets=[{"name": "math", "limit": 10}])
    with pytest.raises(SpecError, match=r"too small for the accuracy gate: 8bit margin -8 pts: "
                       r"power \d+% \(policy 80%\) with items math 10->40; use at least: math limit"):
        Prepared(small)
    enough = write_spec(tmp_path, stages=[{"name": "control", "kind": "control"}],
                        evalsets=[{"name": "math", "limit": 60}])
    plans = Prepared(enough).power
    assert [p.precision for p in plans] == ["8bit"] and plans[0].power >= 0.8
    assert plans[0].reachable == {"math": 240}


@pytest.mark.parametrize(("where", "args", "needle"), [
    ("engine", ["--quantization", "fp8"], r"'--quantization'.*use engine_flags\.quantization"),
    ("engine", ["--quantization=fp8"], r"use engine_flags\.quantization"),
    ("engine", ["-q", "fp8"], r"'-q' \(--quantization\).*engine_flags\.quantization"),
    ("engine", ["-qfp8"], r"engine_flags\.quantization"),
    ("engine", ["--kv_cache_dtype=auto"], r"use engine_flags\.kv_cache_dtype"),
    ("engine", ["--dtype", "float32"], r"use engine\.dtype"),
    ("engine", ["--max-model", "512"], r"\(--max-model-len\).*use engine\.max_model_len"),
    ("engine", ["--port=9000"], r"use engine\.port"),
    ("engine", ["--no-enforce-eager"], r"use engine\.enforce_eager"),
    ("engine", ["--hf-overrides.quantization_config.bits=4"], r"rewrite quantization_config"),
    ("engine", ["--load-format", "dummy"], r"random weights"),
    ("engine", ["--config", "more.yaml"], r"does not check"),
    ("engine", ["--chat-template", "t.jinja"], r"put the template in the checkpoint as "
                                               r"chat_template\.jinja"),
    ("stage", ["--kv-cache-dtype", "auto"], r"stages\.0\.engine_flags\.extra_args.*"
                                             r"use engine_flags\.kv_cache_dtype"),
    ("stage", ["--quantization-config", "{}"], r"use engine_flags\.quantization or a quantized"),
    ("baseline", ["--quantization", "fp8"], r"baseline\.engine_flags\.extra_args"),
])
def test_axis_flags_in_extra_args_are_refused_with_the_typed_field(tmp_path, where, args, needle):
    models = make_demo_checkpoints(tmp_path / "models")
    if where == "engine":
        overrides = {"engine": {"kind": "vllm", "extra_args": args}}
    elif where == "baseline":
        overrides = {"baseline": {"checkpoint": str(models["bf16"]),
                                  "engine_flags": {"extra_args": args}}}
    else:
        overrides = {"stages": [{"name": "kv", "kind": "kv_cache",
                                 "engine_flags": {"kv_cache_dtype": "fp8", "extra_args": args}}]}
    with pytest.raises(SpecError, match=needle):
        load_spec(write_spec(tmp_path, **overrides))


def test_harmless_extra_args_pass(tmp_path):
    spec = load_spec(write_spec(tmp_path, engine={
        "kind": "vllm", "extra_args": ["--max-num-seqs", "8", "--served-model-name", "m",
                                       "--chat-template-content-format", "string"]}))
    assert spec.engine.extra_args == ["--max-num-seqs", "8", "--served-model-name", "m",
                                      "--chat-template-content-format", "string"]


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"engine": {"kind": "external", "url": "http://a:1",
                 "stage_urls": {"weigths": "http://b:1", "activations": "http://c:1",
                                "kv": "http://d:1"}}},
     r"stage_urls: 'weigths' is not a stage; did you mean 'weights'"),
    ({"engine": {"kind": "external", "url": "http://a:1",
                 "stage_urls": {"activations": "http://c:1", "kv": "http://d:1"}}},
     r"stage 'weights' would be served by its parent 'baseline''s own server \(http://a:1\)"),
    ({"engine": {"kind": "external", "url": "localhost:8000"}},
     r"field 'engine.external.url'.*not an http\(s\) URL with a host"),
    ({"engine": {"kind": "external", "url": "http://a:1", "stage_urls": {"weights": "ftp://x"}}},
     r"'ftp://x' is not an http\(s\) URL"),
    ({"engine": {"kind": "vllm", "dtype": "float128"}},
     r"field 'engine.vllm.dtype': 'float128' is not one of its choices; did you mean 'float32'\? "
     r"\(valid: auto, bfloat16, float, float16, float32, half\)"),
    ({"evalsets": [{"name": "math", "limit": 60}, {"name": "math", "limit": 30}]},
     r"evalsets: 'math' listed twice"),
])
def test_external_urls_dtype_and_repeated_sets_are_refused(tmp_path, overrides, needle):
    with pytest.raises(SpecError, match=needle):
        load_spec(write_spec(tmp_path, **overrides))


def test_external_stages_each_on_their_own_server_pass(tmp_path):
    spec = load_spec(write_spec(tmp_path, engine={
        "kind": "external", "url": "http://a:1",
        "stage_urls": {"weights": "http://b:1", "activations": "https://c", "kv": "http://d:1/"}}))
    assert spec.engine.stage_urls["activations"] == "https://c"
