"""A stage whose tokenizer files differ from the baseline's is refused by `validate` in one line
naming both files: the comparability gate would otherwise fail it only after both stages ran."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from tests.flows.checkpoints import W4A16, make_checkpoint
from tests.flows.test_bad_inputs import base_spec, tiny_tokenizer
from tests.infra.test_cpu_support import AVX512

runner = CliRunner()


def other_vocabulary(path):
    data = json.loads(path.read_text())
    data["model"]["vocab"]["extra"] = 1
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("change, expected", [
    (other_vocabulary, "tokenizer file {w4}/tokenizer.json (sha256 "),
    (lambda path: path.unlink(), "{w4}/tokenizer.json is missing but the baseline ships "
                                 "{bf16}/tokenizer.json; the stage would be tokenized differently: "
                                 "copy {bf16}/tokenizer.json into {w4}"),
    (lambda path: path.write_text(path.read_text() + " "), "differs from the baseline's "
                                                           "{bf16}/tokenizer.json (sha256 "),
], ids=["other vocabulary", "no tokenizer.json", "same tokens, other bytes"])
def test_a_stage_tokenized_otherwise_is_refused_at_validate(tmp_path, monkeypatch, change, expected):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path)
    w4 = make_checkpoint(tmp_path / "models" / "w4", W4A16)
    tiny_tokenizer(w4 / "tokenizer.json")
    change(w4 / "tokenizer.json")
    spec["stages"] = [{"name": "w4", "kind": "weights", "checkpoint": str(w4)}]
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = runner.invoke(app, ["validate", str(tmp_path / "spec.yaml")], env={"COLUMNS": "400"})
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: stage 'w4': "), result.output
    assert expected.format(w4=w4, bf16=tmp_path / "models" / "bf16") in lines[0]


def test_a_stage_with_the_baselines_tokenizer_validates(tmp_path, monkeypatch):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path)
    w4 = make_checkpoint(tmp_path / "models" / "w4", W4A16)
    tiny_tokenizer(w4 / "tokenizer.json")
    spec["stages"] = [{"name": "w4", "kind": "weights", "checkpoint": str(w4)}]
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    result = runner.invoke(app, ["validate", str(tmp_path / "spec.yaml")], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
