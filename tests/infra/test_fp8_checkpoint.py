"""The FP8 weight-only checkpoint `make gpu-check` writes without LLM Compressor: decoder linear
weights in float8_e4m3fn with one scale per tensor, read back within FP8's rounding, everything
else unchanged, and a quantization_config whose axes say FP8 weights only."""

from __future__ import annotations

import json

import pytest
import safetensors.torch as safetensors_torch
import torch

from flows.axes import checkpoint_axes
from infra.checkpoint import read_config
from infra.fp8_checkpoint import FP8_MAX, write_fp8_weights
from infra.safetensors_check import check_safetensors

LINEAR = "model.layers.0.self_attn.q_proj.weight"
EMBEDDING = "model.embed_tokens.weight"


def baseline(tmp_path):
    folder = tmp_path / "bf16"
    folder.mkdir()
    generator = torch.Generator().manual_seed(0)
    tensors = {LINEAR: (torch.randn(64, 32, generator=generator) * 0.05).to(torch.bfloat16),
               EMBEDDING: torch.randn(100, 32, generator=generator).to(torch.bfloat16),
               "model.norm.weight": torch.ones(32, dtype=torch.bfloat16)}
    safetensors_torch.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                    "model_type": "llama", "dtype": "bfloat16"}))
    (folder / "tokenizer_config.json").write_text("{}")
    return folder, tensors


def test_linear_weights_become_fp8_with_a_scale_and_read_back_within_its_rounding(tmp_path):
    source, tensors = baseline(tmp_path)
    target = write_fp8_weights(source, tmp_path / "fp8")
    written = safetensors_torch.load_file(target / "model.safetensors")
    weight, scale = written[LINEAR], written[LINEAR.removesuffix("weight") + "weight_scale"]
    assert weight.dtype == torch.float8_e4m3fn and scale.shape == (1,)
    original = tensors[LINEAR].float()
    assert scale.item() == pytest.approx(original.abs().max().item() / FP8_MAX)
    restored = weight.float() * scale
    # E4M3 keeps 3 mantissa bits: a relative error of at most 2^-4 on normal values.
    big = original.abs() > 2**-6 * scale.item() * 8
    assert ((restored - original).abs()[big] / original.abs()[big]).max() <= 2**-4
    assert torch.equal(written[EMBEDDING], tensors[EMBEDDING])  # embeddings stay bf16
    assert (target / "tokenizer_config.json").is_file()


def test_its_config_says_fp8_weights_only_and_its_files_are_whole(tmp_path):
    source, _ = baseline(tmp_path)
    target = write_fp8_weights(source, tmp_path / "fp8")
    check_safetensors(target, read_config(target))  # headers against the file, shapes, dtypes
    weights, activations, _ = checkpoint_axes(read_config(target)["quantization_config"])
    assert (weights, activations) == ("float8/tensor", "none")
    assert write_fp8_weights(source, tmp_path / "fp8") == target  # complete: reused as it is
