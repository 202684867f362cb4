"""Weights that parse but cannot be served (no data, an empty weight, layers or embeddings the
config names missing) and index entries that lead out of the checkpoint are refused from the
headers, in one line; what real checkpoints hold passes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from infra.errors import CheckpointError
from infra.safetensors_check import check_safetensors
from tests.flows.checkpoints import safetensors_bytes

LLAMA = {"model_type": "llama", "num_hidden_layers": 2}  # shapes: tests/infra/test_safetensors_shapes.py


def save(folder: Path, names: list[str], shape=(2, 8)) -> Path:
    save_file({name: np.zeros(shape, np.float16) for name in names},
              str(folder / "model.safetensors"))
    return folder


def llama(layers: int = 2, embed: bool = True, head: bool = False, extra=()) -> list[str]:
    names = [f"model.layers.{n}.mlp.down_proj.weight" for n in range(layers)]
    return names + ["model.embed_tokens.weight"] * embed + ["lm_head.weight"] * head + list(extra)


def refused(folder: Path, config: dict | None = None) -> str:
    with pytest.raises(CheckpointError) as err:
        check_safetensors(folder, config)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_file_whose_tensors_are_all_empty_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes({"a": ("BF16", [0]),
                                                                     "b": ("BF16", [4, 0])}))
    assert refused(tmp_path) == (
        f"{tmp_path / 'model.safetensors'} holds no weight data: its header lists 2 tensors, every "
        "one empty; copy the file again, or save the checkpoint again (a partial copy or an "
        "interrupted save)")


def test_an_empty_weight_is_refused_by_name(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes({
        "model.embed_tokens.weight": ("BF16", [0, 8]), "model.norm.weight": ("BF16", [8])}))
    assert "tensor 'model.embed_tokens.weight': shape [0, 8] holds no values (an empty " \
           "weight)" in refused(tmp_path)


@pytest.mark.parametrize("names, config, expected", [
    (["model.embed_tokens.weight"], LLAMA, "the weights hold no layer (no tensor named like "
     "model.layers.N.) but {dir}/config.json says num_hidden_layers 2"),
    (llama(embed=False), LLAMA, "the weights hold no model.embed_tokens.* tensor, the token "
     "embeddings the model needs ({dir}/config.json)"),
    (llama(), LLAMA | {"tie_word_embeddings": False}, "the weights hold no lm_head.* tensor, the "
     "output head (tie_word_embeddings is false)"),
    ([f"transformer.h.{n}.attn.c_attn.weight" for n in (0, 2)], LLAMA, "the weights hold 2 "
     "layers (transformer.h.N, N up to 2) but {dir}/config.json says num_hidden_layers 2: layer "
     "1 is missing"),
    (llama(layers=3), LLAMA, "says num_hidden_layers 2: they hold layer 2 (1 beyond)"),
], ids=["no layers", "no embeddings", "untied head missing", "GPT-2 naming", "a layer beyond"])
def test_weights_the_config_names_must_be_there(tmp_path, names, config, expected):
    assert expected.format(dir=tmp_path) in refused(save(tmp_path, names), config)


@pytest.mark.parametrize("names, config", [
    (llama(), LLAMA),
    (llama(head=True), LLAMA | {"tie_word_embeddings": False}),
    (llama(extra=["model.layers.2.eh_proj.weight"]), LLAMA | {"num_nextn_predict_layers": 1}),
    ([f"gpt_neox.layers.{n}.mlp.weight" for n in range(2)] + ["gpt_neox.embed_in.weight"], LLAMA),
    (llama() + [f"model.vision_tower.layers.{n}.weight" for n in range(5)], LLAMA),
    (["model.embed_tokens.weight"], {"model_type": "llama"}),  # nothing to compare against
], ids=["llama", "untied head", "multi-token prediction layer", "NeoX naming", "vision tower",
        "no layer count"])
def test_what_real_checkpoints_hold_passes(tmp_path, names, config):
    check_safetensors(save(tmp_path, names), config)


def index(folder: Path, weight_map: dict) -> Path:
    (folder / "model.safetensors").write_bytes(safetensors_bytes())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("file, expected", [
    ("model\x00.safetensors", r'is "model\u0000.safetensors" (a string), not a plain file name '
     "in the checkpoint folder (a path, or a control character such as a NUL byte)"),
    ("../other/model.safetensors", "not a plain file name in the checkpoint folder"),
    ("/etc/passwd", "not a plain file name in the checkpoint folder"),
    ("", 'is "" (a string), not a .safetensors file name'),
    (".safetensors", "not a .safetensors file name"),
    (7, "is 7 (a number), not a file name"),
])
def test_an_index_entry_must_name_a_shard_in_the_folder(tmp_path, file, expected):
    line = refused(index(tmp_path, {"model.embed_tokens.weight": file}))
    assert line.startswith(f"{tmp_path / 'model.safetensors.index.json'}: weight_map[\"model."
                           "embed_tokens.weight\"] is "), line
    assert expected in line and line.endswith("; save the checkpoint again")
    assert "\x00" not in line


def test_an_index_that_is_not_an_object_says_what_it_is(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes())
    (tmp_path / "model.safetensors.index.json").write_text("[1, 2]")
    assert refused(tmp_path) == (f"{tmp_path / 'model.safetensors.index.json'} is [1, 2] (a "
                                 "list), not an object with a weight_map; save the checkpoint again")
