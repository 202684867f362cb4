"""Broken checkpoints `validate` (and `run`, which validates first) must refuse before any engine
starts: exit 2, one line naming the file, the field and the value, no traceback."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.axes import checkpoint_axes, derive_axes
from flows.cli import app
from infra.errors import SpecError
from tests.flows.checkpoints import W4A16, make_checkpoint, safetensors_bytes
from tests.flows.test_bad_inputs import base_spec, external, tiny_tokenizer
from tests.infra.test_cpu_support import AVX512

runner = CliRunner()


def stage(spec: dict, tmp_path: Path, quantization_config: dict | None = W4A16,
          name: str = "w4") -> Path:
    """A weights stage on a fresh checkpoint that validates as it is."""
    checkpoint = make_checkpoint(tmp_path / "models" / name, quantization_config)
    tiny_tokenizer(checkpoint / "tokenizer.json")
    spec["stages"] = [{"name": "w4", "kind": "weights", "checkpoint": str(checkpoint)}]
    return checkpoint


def edit_config(checkpoint: Path, **changes) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps(config | changes))


def weights_args(change):
    def apply(spec: dict, tmp_path: Path) -> None:
        qc = copy.deepcopy(W4A16)
        change(qc, qc["config_groups"]["group_0"]["weights"])
        edit_config(stage(spec, tmp_path, None), quantization_config=qc)
    return apply


def config(**changes):
    return lambda spec, tmp_path: edit_config(stage(spec, tmp_path, None), **changes)


def file(name: str, data: bytes):
    return lambda spec, tmp_path: (stage(spec, tmp_path) / name).write_bytes(data)


def index(weight_map: dict):
    text = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    return file("model.safetensors.index.json", text)


def symlink_loop(spec: dict, tmp_path: Path, relative: bool) -> None:
    loop = tmp_path / "models" / "loop"
    loop.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(loop, loop)
    spec["stages"] = [{"name": "w4", "kind": "weights",
                       "checkpoint": "models/loop" if relative else str(loop)}]


def evalset_loop(spec: dict, tmp_path: Path) -> None:
    os.symlink(tmp_path / "mine.jsonl", tmp_path / "mine.jsonl")
    spec["evalsets"].append({"name": "mine", "path": "mine.jsonl", "scorer": {"kind": "exact"}})


HEADER = safetensors_bytes()
CASES = [
    # quantization_config: tracebacks before
    ("num_bits a string", weights_args(lambda qc, w: w.update(num_bits="4")),
     'w4/config.json: quantization_config.config_groups.group_0.weights.num_bits is "4" (a '
     "string), not an integer number of bits: write 4"),
    ("config_groups a list",
     weights_args(lambda qc, w: qc.update(config_groups=list(qc["config_groups"].values()))),
     "w4/config.json: quantization_config.config_groups is a list; compressed-tensors takes an "
     "object of named schemes"),
    ("quantization_config a string", config(quantization_config="w4a16"),
     'w4/config.json: quantization_config is "w4a16" (a string), not an object'),
    ("kv_cache_scheme a string", weights_args(lambda qc, w: qc.update(kv_cache_scheme="fp8")),
     'quantization_config.kv_cache_scheme is "fp8" (a string), not an object'),
    ("quantgate_emulated true", config(quantgate_emulated=True),
     "w4/config.json: quantgate_emulated is true (a boolean), not an object"),
    ("quantgate_emulated without its config",
     config(quantgate_emulated={"method": "dequantized", "quantization_config": None}),
     "w4/config.json: quantgate_emulated.quantization_config is missing (or null)"),
    ("gptq bits a string", config(quantization_config={"quant_method": "gptq", "bits": "4",
                                                       "group_size": 128}),
     'w4/config.json: quantization_config.bits is "4" (a string), not an integer number of bits'),
    # quantization_config: accepted and wrong later before
    ("num_bits 0", weights_args(lambda qc, w: w.update(num_bits=0)),
     "weights.num_bits is 0; compressed-tensors type 'int' takes 2 to 8 bits"),
    ("num_bits 16", weights_args(lambda qc, w: w.update(num_bits=16)),
     "weights.num_bits is 16; compressed-tensors type 'int' takes 2 to 8 bits; layers kept in "
     "the model dtype go in the config's ignore list"),
    ("gptq without bits", config(quantization_config={"quant_method": "gptq", "group_size": 128}),
     "w4/config.json: quantization_config.bits is missing (or null); GPTQ needs its number of "
     "bits: 4 or 8"),
    # config.json
    ("config.json 100,000 deep", file("config.json", b"[" * 100_000 + b"]" * 100_000),
     "w4/config.json is not a model file: it nests deeper than Python's JSON reader can follow"),
    ("NaN in config.json", file("config.json", b'{"model_type": "llama", "hidden_size": NaN}'),
     "w4/config.json: hidden_size is NaN, which JSON does not allow; write a number"),
    ("checkpoint a symlink loop (relative)", lambda s, t: symlink_loop(s, t, relative=True),
     "field 'stages.0.checkpoint': models/loop cannot be followed (Symlink loop"),
    ("checkpoint a symlink loop (absolute)", lambda s, t: symlink_loop(s, t, relative=False),
     "models/loop is a symlink that leads to no folder (a loop, or its target is gone)"),
    ("eval-set path a symlink loop", evalset_loop,
     "field 'evalsets.1.path': mine.jsonl cannot be followed (Symlink loop"),
    # tokenizer
    ("tokenizer.json garbage", file("tokenizer.json", b"\x00garbage{{{"),
     "w4/tokenizer.json does not load as a tokenizer (expected value at line 1 column 1); copy "
     "the base model's tokenizer.json into the checkpoint"),
    ("tokenizer.json empty", file("tokenizer.json", b""),
     "w4/tokenizer.json is empty (0 bytes); copy the base model's tokenizer.json"),
    ("tokenizer.json without a model", file("tokenizer.json", b'{"version": "1.0"}'),
     "w4/tokenizer.json does not load as a tokenizer"),
    # safetensors: a 'not servable' rollback after the baseline ran, before
    ("safetensors header length past the file",
     file("model.safetensors", (10**9).to_bytes(8, "little") + HEADER[8:]),
     "w4/model.safetensors is not a whole safetensors file: its header length field reads "
     "1000000000 bytes, more than the"),
    ("safetensors header not JSON",
     file("model.safetensors", (4).to_bytes(8, "little") + b"{{{{" + b"\0" * 8),
     "w4/model.safetensors (safetensors header) is not valid JSON"),
    ("zero-byte weights", file("model.safetensors", b""),
     "w4/model.safetensors is empty (0 bytes)"),
    ("weights all zeros", file("model.safetensors", b"\0" * 4096),
     "w4/model.safetensors is not a safetensors file: its header length field reads 0"),
    ("weights truncated", file("model.safetensors", HEADER[:-10]),
     "past the end of the"),
    ("no tensors", file("model.safetensors", (2).to_bytes(8, "little") + b"{}"),
     "w4/model.safetensors holds no tensors"),
    ("index names a missing shard", index({"model.embed_tokens.weight": "model.safetensors",
                                           "lm_head.weight": "model-00002-of-00002.safetensors"}),
     "model.safetensors.index.json: weight_map maps 'lm_head.weight' to "
     "model-00002-of-00002.safetensors, which is not in"),
    ("index maps a weight its shard lacks", index({"model.embed_tokens.weight": "model.safetensors",
                                                   "lm_head.weight": "model.safetensors"}),
     "model.safetensors.index.json: weight_map maps 'lm_head.weight' to model.safetensors, whose "
     "header does not list it"),
    # chat template: the comparability gate found it after both stages ran, before
    ("chat template unlike the baseline's", file("chat_template.jinja", b"{{ messages }}"),
     "stage 'w4': chat template "),
]


def validate(tmp_path: Path, spec: dict, command: str = "validate") -> list[str]:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = runner.invoke(app, [command, str(path)], env={"COLUMNS": "400"})
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, (result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines


@pytest.mark.parametrize("change, expected", [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_validate_refuses_a_broken_checkpoint_in_one_line(tmp_path, monkeypatch, change, expected):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path)
    change(spec, tmp_path)
    assert expected in validate(tmp_path, spec)[0]


@pytest.mark.parametrize("case", ["num_bits 16", "weights all zeros",
                                  "chat template unlike the baseline's"])
def test_run_refuses_it_before_any_engine(tmp_path, monkeypatch, case):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    change, expected = next(c[1:] for c in CASES if c[0] == case)
    spec = base_spec(tmp_path)
    change(spec, tmp_path)
    assert expected in validate(tmp_path, spec, "run")[0]


def test_the_template_message_says_what_to_copy(tmp_path, monkeypatch):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path)
    baseline = Path(spec["baseline"]["checkpoint"])
    (baseline / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}\n{% endfor %}")
    (stage(spec, tmp_path) / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    line = validate(tmp_path, spec)[0]
    assert "(first difference at line 1)" in line
    assert f"copy {baseline / 'chat_template.jinja'} into {tmp_path / 'models' / 'w4'}" in line


def test_the_same_template_in_either_file_validates(tmp_path, monkeypatch):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path)
    template = "{{ messages[0]['content'] }}"
    (Path(spec["baseline"]["checkpoint"]) / "chat_template.jinja").write_text(template)
    checkpoint = stage(spec, tmp_path)
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output


def test_plain_completions_do_not_compare_templates(tmp_path, monkeypatch):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path) | {"chat_template": False}
    (stage(spec, tmp_path) / "chat_template.jinja").write_text("{{ messages }}")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("qc", ["w4a16", {"quant_method": "compressed-tensors", "config_groups": []},
                                {"quant_method": "awq", "w_bit": 4}])
def test_axes_of_a_bad_config_are_a_spec_error_not_a_crash(qc):
    with pytest.raises(SpecError, match="^config.json quantization_config"):
        derive_axes({"model_type": "llama", "quantization_config": qc}, {})
    with pytest.raises(SpecError, match="^config.json quantization_config"):
        checkpoint_axes(qc)


def test_axes_take_compressed_tensors_defaults():
    # num_bits defaults to 8 and the strategy follows group_size, as compressed-tensors reads them.
    qc = {"quant_method": "compressed-tensors", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"group_size": 128}, "input_activations": None}}}
    assert derive_axes({"quantization_config": qc}, {}).weights == "int8/group128"


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_baseline_without_a_chat_template_is_refused_before_any_engine(tmp_path, monkeypatch,
                                                                        command):
    """vLLM refuses the chat endpoint without a template and the scoring corpus renders with it:
    found at validate, not as a traceback after the baseline's eval sets ran."""
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path)
    baseline = Path(spec["baseline"]["checkpoint"])
    (baseline / "tokenizer_config.json").unlink()
    line = validate(tmp_path, spec, command)[0]
    assert f"baseline checkpoint {baseline} has no chat template" in line
    assert f"add the model's template as {baseline / 'chat_template.jinja'}" in line
    assert "or set chat_template: false in the spec to ask plain completions" in line


def test_an_external_engines_baseline_needs_the_template_too(tmp_path, monkeypatch):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path)
    external(spec)
    (Path(spec["baseline"]["checkpoint"]) / "tokenizer_config.json").write_text("{}")
    assert "has no chat template" in validate(tmp_path, spec)[0]


def test_a_base_model_without_a_template_validates_on_plain_completions(tmp_path, monkeypatch):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path) | {"chat_template": False}
    (Path(spec["baseline"]["checkpoint"]) / "tokenizer_config.json").unlink()
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
