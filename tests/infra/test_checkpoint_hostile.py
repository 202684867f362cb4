"""Hostile checkpoint files, second round: each is refused before any engine starts, in one line
naming the file, the field and the value and what to change; `validate` exits 2 without a
traceback (and without the Rust library's panic on its stderr)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from infra.checkpoint import check_checkpoint, check_same_chat_template, read_config
from infra.errors import CheckpointError
from tests.flows.checkpoints import CHAT_TEMPLATE, make_checkpoint
from tests.flows.test_bad_checkpoints import stage, validate
from tests.flows.test_bad_inputs import base_spec, tiny_tokenizer
from tests.infra.test_cpu_support import AVX512


def checkpoint(tmp_path: Path, name: str = "m") -> Path:
    folder = make_checkpoint(tmp_path / name)
    tiny_tokenizer(folder / "tokenizer.json")
    return folder


def edit_config(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))
    return folder


def refused(call, *args) -> str:
    with pytest.raises(CheckpointError) as err:
        call(*args)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("changes, expected", [
    ({"hidden_size": "576"}, 'config.json: hidden_size is "576" (a string): write 576'),
    ({"num_hidden_layers": 0}, "config.json: num_hidden_layers is 0 (a number); write a positive "
     "whole number"),
    ({"vocab_size": 49152.5}, "config.json: vocab_size is 49152.5 (a number); write a positive"),
    ({"num_key_value_heads": True}, "num_key_value_heads is true (a boolean)"),
    ({"num_local_experts": -1}, "num_local_experts is -1 (a number); write a whole number"),
    ({"model_type": 5}, 'model_type is 5 (a number); write the model type, e.g. "llama"'),
    ({"architectures": "LlamaForCausalLM"}, 'architectures is "LlamaForCausalLM" (a string); '
     'write a list of class names, e.g. ["LlamaForCausalLM"]'),
    ({"tie_word_embeddings": "true"}, 'tie_word_embeddings is "true" (a string); write true or '
     "false"),
    ({"text_config": {"hidden_size": "8"}}, 'text_config.hidden_size is "8" (a string): write 8'),
    ({"text_config": "llama"}, 'text_config is "llama" (a string); write the language model'),
])
def test_config_keys_an_engine_sizes_the_model_by_are_checked(tmp_path, changes, expected):
    folder = edit_config(checkpoint(tmp_path), **changes)
    assert expected in refused(read_config, folder)


@pytest.mark.parametrize("changes", [
    {"intermediate_size": [1536, 1536, 3072]},  # one per layer (Gemma 3n)
    {"head_dim": None, "num_key_value_heads": None},  # the architecture's default
    {"num_experts": 0, "text_config": {"hidden_size": 8, "model_type": "llama"}},
])
def test_what_real_configs_write_passes(tmp_path, changes):
    read_config(edit_config(checkpoint(tmp_path), **changes))


def test_an_integer_too_long_to_read_is_one_line(tmp_path):
    folder = checkpoint(tmp_path)
    (folder / "config.json").write_text('{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}")
    assert refused(read_config, folder) == (
        f"{folder / 'config.json'} is not a model file: it holds an integer of more than 4,300 "
        "digits; write it again from the model's own")


def test_a_json_file_larger_than_any_models_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr("infra.jsonfile.MAX_BYTES", 100)
    folder = checkpoint(tmp_path)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "x": "y" * 200}))
    line = refused(read_config, folder)
    assert line.endswith("bytes, more than any model's JSON file (100 at most); copy it again "
                         "from the model it came from"), line


def test_a_checkpoint_path_with_a_nul_byte_is_named_with_the_byte_escaped(tmp_path):
    line = refused(read_config, tmp_path / "w\x004")
    assert line == (f"checkpoint {tmp_path}/w\\x004 holds a NUL byte (\\x00), which no file "
                    "name can; write the path without it")


def test_a_config_json_that_is_a_symlink_loop_says_so(tmp_path):
    folder = checkpoint(tmp_path)
    (folder / "config.json").unlink()
    os.symlink(folder / "config.json", folder / "config.json")
    assert refused(read_config, folder) == (
        f"{folder / 'config.json'} is a symlink loop (it leads back to itself); copy the model's "
        "config.json into the checkpoint")


def panicking_tokenizer(path: Path) -> None:
    """A tokenizer.json the library loads, then panics on (a post-processor naming a special
    token that is not in the vocabulary): a BaseException in-process, with a Rust backtrace."""
    tiny_tokenizer(path)
    data = json.loads(path.read_text())
    data["post_processor"] = {"type": "TemplateProcessing", "pair": [], "special_tokens": {},
                              "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}]}
    path.write_text(json.dumps(data))


def empty_vocabulary(path: Path) -> None:
    from tokenizers import Tokenizer, models

    Tokenizer(models.BPE({}, [])).save(str(path))  # no unknown token: every word is dropped


@pytest.mark.parametrize("write, expected", [
    (panicking_tokenizer, "tokenizer.json loads, but cannot encode a line of text (the "
     "tokenizers library panicked: no entry found for key); copy the base model's tokenizer.json "
     "into the checkpoint"),
    (empty_vocabulary, "tokenizer.json encodes a line of text to no tokens at all (an empty "
     "vocabulary)"),
    (lambda path: path.write_text("[" * 200 + "]" * 200), "tokenizer.json does not load as a "
     "tokenizer (invalid type: sequence"),
])
def test_a_tokenizer_the_library_cannot_use_is_one_line(tmp_path, write, expected):
    folder = checkpoint(tmp_path)
    write(folder / "tokenizer.json")
    assert expected in refused(check_checkpoint, folder)


def test_a_panicking_tokenizer_is_one_line_at_validate_with_nothing_on_stderr(tmp_path, monkeypatch,
                                                                             capfd):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path)
    panicking_tokenizer(stage(spec, tmp_path) / "tokenizer.json")
    [line] = validate(tmp_path, spec)
    assert "tokenizers library panicked" in line
    assert "panicked at" not in capfd.readouterr().err  # the child's Rust backtrace stays there


def test_an_empty_sentencepiece_model_is_refused(tmp_path):
    folder = make_checkpoint(tmp_path / "m")
    (folder / "vocab.json").unlink()
    (folder / "tokenizer.model").write_bytes(b"")
    assert refused(check_checkpoint, folder) == (
        f"{folder / 'tokenizer.model'} is empty (0 bytes); copy the base model's tokenizer.model "
        "into the checkpoint")


def test_a_different_template_is_refused_with_both_digests_and_the_stage(tmp_path):
    import hashlib

    baseline, candidate = checkpoint(tmp_path, "base"), checkpoint(tmp_path, "cand")
    (candidate / "chat_template.jinja").write_text("{{ messages }}")
    line = refused(check_same_chat_template, "weights", candidate, baseline)
    mine = hashlib.sha256(b"{{ messages }}").hexdigest()[:16]
    theirs = hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()[:16]
    assert line.startswith(f"stage 'weights': chat template {candidate / 'chat_template.jinja'} "
                           f"(sha256 {mine}) differs from the baseline's "
                           f"{baseline / 'tokenizer_config.json'} chat_template (sha256 {theirs})")


def test_a_template_that_differs_only_in_line_ends_is_refused(tmp_path):
    """The comparability gate hashes the file's bytes: CRLF is a different template to it."""
    baseline, candidate = checkpoint(tmp_path, "base"), checkpoint(tmp_path, "cand")
    text = "{% for m in messages %}\n{{ m.content }}\n{% endfor %}\n"
    (baseline / "chat_template.jinja").write_bytes(text.encode())
    (candidate / "chat_template.jinja").write_bytes(text.replace("\n", "\r\n").encode())
    assert "(first difference at line 1)" in refused(check_same_chat_template, "w", candidate,
                                                     baseline)


def test_the_gate_and_the_check_hash_a_template_alike(tmp_path):
    from gates.comparability import chat_template_hash

    folder = checkpoint(tmp_path)
    (folder / "chat_template.jinja").write_bytes(b"{{ messages }}\r\n")
    other = checkpoint(tmp_path, "other")
    line = refused(check_same_chat_template, "w", folder, other)
    assert f"(sha256 {chat_template_hash(folder)})" in line
    assert f"(sha256 {chat_template_hash(other)})" in line


@pytest.mark.parametrize("change, expected", [
    (lambda folder: edit_config(folder, hidden_size="8"), 'config.json: hidden_size is "8" '
     "(a string): write 8"),
    (lambda folder: (folder / "config.json").write_text('{"model_type": "llama", "vocab_size": '
                                                         + "1" * 5000 + "}"),
     "config.json is not a model file: it holds an integer of more than 4,300 digits"),
    (lambda folder: panicking_tokenizer(folder / "tokenizer.json"), "tokenizers library panicked"),
])
def test_validate_refuses_each_in_one_line(tmp_path, monkeypatch, change, expected):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    spec = base_spec(tmp_path)
    change(stage(spec, tmp_path))
    assert expected in validate(tmp_path, spec)[0]
