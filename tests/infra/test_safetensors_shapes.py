"""Weights whose shapes contradict config.json (another model's config, a missing shard) are refused
from the headers, before any engine starts; packed (quantized) tensors are not compared."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from infra.checkpoint import check_checkpoint
from infra.errors import CheckpointError

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
          "vocab_size": 16, "num_hidden_layers": 2}


def checkpoint(tmp_path, config=None, layers=2, embed=(16, 8), packed=False):
    tensors = {"model.norm.weight": np.zeros(8, np.float16),
               "model.embed_tokens.weight": np.zeros(embed, np.int32 if packed else np.float16)}
    for layer in range(layers):
        tensors[f"model.layers.{layer}.input_layernorm.weight"] = np.zeros(8, np.float16)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(CONFIG | (config or {})))
    (tmp_path / "vocab.json").write_text("{}")
    return tmp_path


def test_weights_that_fit_their_config_pass(tmp_path):
    check_checkpoint(checkpoint(tmp_path))


def test_a_packed_embedding_is_not_compared(tmp_path):
    check_checkpoint(checkpoint(tmp_path, embed=(16, 2), packed=True))


@pytest.mark.parametrize("kwargs, expected", [
    ({"config": {"vocab_size": 32}},
     "tensor 'model.embed_tokens.weight' has shape [16, 8] but {dir}/config.json says vocab_size "
     "32, hidden_size 8 (shape [32, 8])"),
    ({"config": {"hidden_size": 4}},
     "tensor 'model.norm.weight' has shape [8] but {dir}/config.json says hidden_size 4"),
    ({"layers": 1}, "the weights hold 1 layers (model.layers.N, N up to 0) but {dir}/config.json "
                    "says num_hidden_layers 2: layer 1 is missing"),
    ({"config": {"num_hidden_layers": 1}}, "says num_hidden_layers 1: they hold layer 1"),
], ids=["vocab_size", "hidden_size", "a layer missing", "a layer beyond"])
def test_a_shape_config_json_contradicts_is_refused(tmp_path, kwargs, expected):
    folder = checkpoint(tmp_path, **kwargs)
    with pytest.raises(CheckpointError) as caught:
        check_checkpoint(folder)
    assert expected.format(dir=folder) in str(caught.value)
    assert "\n" not in str(caught.value)
