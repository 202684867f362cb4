"""A checkpoint's own files, read before any engine: config.json, tokenizer, chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.checkpoint import chat_template, check_checkpoint, check_same_chat_template, read_config
from infra.errors import CheckpointError
from infra.jsonfile import MAX_DEPTH
from tests.flows.checkpoints import W4A16, make_checkpoint
from tests.flows.test_bad_inputs import tiny_tokenizer


def test_a_config_deeper_than_any_model_is_refused_below_the_recursion_limit(tmp_path):
    folder = make_checkpoint(tmp_path / "m")
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    (folder / "config.json").write_text(f'{{"model_type": "llama", "extra": {deep}}}')
    with pytest.raises(CheckpointError, match=r"config.json: nests deeper than 64 levels \(at extra"):
        read_config(folder)


def test_infinity_is_named_by_its_field(tmp_path):
    folder = make_checkpoint(tmp_path / "m", W4A16)
    text = (folder / "config.json").read_text().replace('"group_size": 64', '"group_size": -Infinity')
    (folder / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match="quantization_config.config_groups.group_0.weights."
                       "group_size is -Infinity, which JSON does not allow"):
        read_config(folder)


def test_a_bad_quantization_config_names_the_file(tmp_path):
    folder = make_checkpoint(tmp_path / "m", W4A16 | {"kv_cache_scheme": "fp8"})
    with pytest.raises(CheckpointError, match=f"^{folder / 'config.json'}: quantization_config"):
        read_config(folder)


def checkpoint(tmp_path: Path, name: str = "m") -> Path:
    folder = make_checkpoint(tmp_path / name)
    tiny_tokenizer(folder / "tokenizer.json")
    return folder


def test_a_whole_checkpoint_passes(tmp_path):
    check_checkpoint(checkpoint(tmp_path))


@pytest.mark.parametrize("name, text, expected", [
    ("tokenizer_config.json", "[]", "tokenizer_config.json is a JSON list, not an object"),
    ("tokenizer_config.json", '{"chat_template": 7}', "tokenizer_config.json chat_template is 7"),
    ("tokenizer_config.json", "{", "tokenizer_config.json is not valid JSON"),
    ("chat_template.jinja", b"\xff\xfe{{", "chat_template.jinja is not UTF-8 text"),
])
def test_a_tokenizer_file_that_will_not_read_is_refused(tmp_path, name, text, expected):
    folder = checkpoint(tmp_path)
    path = folder / name
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    with pytest.raises(CheckpointError, match=str(path)) as err:
        check_checkpoint(folder)
    assert expected in str(err.value)


def test_a_vocab_only_tokenizer_must_be_a_vocabulary(tmp_path):
    folder = make_checkpoint(tmp_path / "m")  # vocab.json "{}", no tokenizer.json
    check_checkpoint(folder)
    (folder / "vocab.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="vocab.json is not a vocabulary"):
        check_checkpoint(folder)


def test_named_templates_compare_as_the_gate_hashes_them(tmp_path):
    base, stage = checkpoint(tmp_path, "base"), checkpoint(tmp_path, "stage")
    named = [{"name": "default", "template": "{{ messages }}"}, {"name": "tool_use", "template": "x"}]
    (base / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    (stage / "tokenizer_config.json").write_text(json.dumps({"chat_template": named[::-1]}))
    assert chat_template(base)[0] != chat_template(stage)[0]  # another order is another list
    with pytest.raises(CheckpointError, match="copy the baseline's chat_template into"):
        check_same_chat_template("w4", stage, base)
    (stage / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    check_same_chat_template("w4", stage, base)


def test_a_stage_without_the_baselines_template_is_told_to_copy_it(tmp_path):
    base, stage = checkpoint(tmp_path, "base"), checkpoint(tmp_path, "stage")
    (stage / "tokenizer_config.json").unlink()  # the stage ships no template
    (base / "chat_template.jinja").write_text("{{ messages }}")
    with pytest.raises(CheckpointError, match=f"chat template none .*copy {base / 'chat_template.jinja'} "
                       f"into {stage}"):
        check_same_chat_template("w4", stage, base)
