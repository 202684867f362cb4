"""Tiny fake checkpoint folders (config.json + a weight file) for spec and plan tests."""

from __future__ import annotations

import json
import struct
from pathlib import Path


def int_args(bits: int, strategy: str, group_size: int | None = None, dynamic: bool = False) -> dict:
    return {
        "num_bits": bits, "type": "int", "symmetric": True, "strategy": strategy,
        "group_size": group_size, "dynamic": dynamic, "observer": "minmax",
    }


def compressed_tensors(weights: dict, activations: dict | None = None) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized" if weights["num_bits"] == 4 else "int-quantized",
        "config_groups": {"group_0": {
            "targets": ["Linear"], "weights": weights, "input_activations": activations,
            "output_activations": None,
        }},
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "quantization_status": "compressed",
    }


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
W8A16 = compressed_tensors(int_args(8, "channel"))
W8A8 = compressed_tensors(int_args(8, "channel"), int_args(8, "token", dynamic=True))
W4A16 = compressed_tensors(int_args(4, "group", 64))


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]] | None = None) -> bytes:
    """A whole safetensors file of zero-filled tensors {name: (dtype, shape)}: the 8-byte header
    length, the JSON header, the data."""
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "I8": 1, "I32": 4, "F8_E4M3": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in (tensors or {"model.embed_tokens.weight": ("BF16", [4, 8])}).items():
        size = sizes[dtype]
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps({"__metadata__": {"format": "pt"}, **header}).encode()
    return struct.pack("<Q", len(text)) + text + b"\0" * offset


def make_checkpoint(folder: Path, quantization_config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "bfloat16"}
    if quantization_config:
        config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(safetensors_bytes())
    (folder / "vocab.json").write_text("{}")  # a tokenizer file: the engine needs one
    # The chat endpoint needs a template (validate refuses a baseline without one).
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    return folder


def make_demo_checkpoints(root: Path) -> dict[str, Path]:
    return {
        "bf16": make_checkpoint(root / "bf16"),
        "w8a16": make_checkpoint(root / "w8a16", W8A16),
        "w8a8": make_checkpoint(root / "w8a8", W8A8),
        "w4a16": make_checkpoint(root / "w4a16", W4A16),
    }


def emulated(source: str, quantization_config: dict) -> dict:
    """The config key a dequantized (quantize -> dequantize -> bf16) checkpoint carries."""
    return {"method": "dequantized", "source": source, "quantization_config": quantization_config}


def make_emulated_checkpoint(folder: Path, source: str, quantization_config: dict) -> Path:
    make_checkpoint(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantgate_emulated"] = emulated(source, quantization_config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder
