"""Reading a checkpoint folder: is it a model, how big are its weights, what quantization it carries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.errors import CheckpointError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # fast, sentencepiece, BPE


def read_config(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's config.json, or a CheckpointError naming what is wrong."""
    if not checkpoint.exists():
        raise CheckpointError(f"checkpoint {checkpoint} does not exist")
    if not checkpoint.is_dir():
        raise CheckpointError(f"checkpoint {checkpoint} is not a directory")
    config_path = checkpoint / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"checkpoint {checkpoint} is not a model: no config.json")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{config_path} is not valid JSON: {err}") from err
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{config_path} is not UTF-8 text: {err.reason}") from err
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path} is not a model config: a JSON "
                              f"{type(config).__name__}, not an object")
    if "model_type" not in config and "architectures" not in config:
        raise CheckpointError(f"{config_path} is not a model config: no model_type or architectures")
    if not any(path.suffix in WEIGHT_SUFFIXES for path in checkpoint.iterdir()):
        raise CheckpointError(f"checkpoint {checkpoint} is not a model: no weight files")
    return config


def check_tokenizer(checkpoint: Path) -> None:
    """The engine loads the tokenizer from the checkpoint: it must ship one."""
    if not any((checkpoint / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"checkpoint {checkpoint} has no tokenizer (none of "
                              f"{', '.join(TOKENIZER_FILES)}); copy the base model's tokenizer "
                              "files into it")


SHAPE_KEYS = ("model_type", "architectures", "hidden_size", "intermediate_size",
              "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "vocab_size", "tie_word_embeddings", "num_experts", "num_local_experts",
              "text_config", "max_position_embeddings", "torch_dtype", "dtype")


def model_shape(checkpoint: Path) -> dict[str, Any]:
    """The config.json keys that describe the model's shape (not its quantization)."""
    config = read_config(checkpoint)
    return {key: config[key] for key in SHAPE_KEYS if key in config}


def weight_bytes(checkpoint: Path) -> int:
    """Bytes of weight files on disk: a fair weight-size figure across formats."""
    return sum(p.stat().st_size for p in checkpoint.iterdir() if p.suffix in WEIGHT_SUFFIXES)
