"""An FP8 (E4M3) weight-only checkpoint, one scale per tensor, in compressed-tensors'
float-quantized format, written with torch and safetensors alone: the weights-only stage that
keeps online FP8 one change at a time, where LLM Compressor's own environment (a CPU torch
build) is not at hand, as on the CUDA host of `make gpu-check`.

Usage: `python -m infra.fp8_checkpoint MODELS_DIR` makes the demo baseline when it is missing and
`MODELS_DIR/smollm2-135m-fp8-weights` from it."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

from infra.checkpoint import read_config
from infra.demo_models import convert_demo_baseline, write_atomically

FP8_NAME = "smollm2-135m-fp8-weights"
FP8_MAX = 448.0  # largest finite float8_e4m3fn
# The decoder's linear layers (attention and MLP projections); embeddings and lm_head stay bf16.
LINEAR = re.compile(r"\.(self_attn|mlp)\.\w+_proj\.weight$")
# What compressed-tensors writes for FP8 per-tensor weights (QuantizationArgs, version 0.17).
QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors", "format": "float-quantized",
    "config_groups": {"group_0": {
        "targets": ["Linear"], "format": "float-quantized",
        "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor",
                    "dynamic": False, "group_size": None, "block_structure": None,
                    "actorder": None, "observer": "minmax"},
        "input_activations": None, "output_activations": None}},
    "ignore": ["lm_head"], "kv_cache_scheme": None, "quantization_status": "compressed",
    "sparsity_config": {}, "version": "0.17.0",
}


def quantize_weights(tensors: dict) -> dict:
    """Each decoder linear weight as float8_e4m3fn with its per-tensor `weight_scale` (amax /
    448, shape [1] as compressed-tensors stores it); every other tensor unchanged."""
    import torch

    out = {}
    for name, tensor in tensors.items():
        if not LINEAR.search(name):
            out[name] = tensor
            continue
        weight = tensor.float()
        scale = weight.abs().amax().clamp(min=1e-12) / FP8_MAX
        out[name] = (weight / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        out[name.removesuffix("weight") + "weight_scale"] = scale.reshape(1).to(torch.float32)
    return out


def write_fp8_weights(baseline: Path, target: Path) -> Path:
    """`baseline` (a single-file safetensors checkpoint) with FP8 per-tensor weights, at
    `target`; reused when already complete."""
    from safetensors.torch import load_file, save_file

    def write(out: Path) -> None:
        out.mkdir(parents=True)
        save_file(quantize_weights(load_file(baseline / "model.safetensors")),
                  out / "model.safetensors", metadata={"format": "pt"})
        config = read_config(baseline) | {"quantization_config": QUANTIZATION_CONFIG}
        (out / "config.json").write_text(json.dumps(config, indent=2))
        for path in baseline.iterdir():  # tokenizer, chat template, generation config
            if path.is_file() and path.suffix in (".json", ".jinja", ".txt") and \
                    path.name not in ("config.json", "model.safetensors.index.json"):
                shutil.copy2(path, out / path.name)

    return write_atomically(target, write)


def main(argv: list[str] | None = None) -> int:
    models = Path((argv if argv is not None else sys.argv[1:] or ["models"])[0])
    baseline = convert_demo_baseline(models)
    print(f"ready: {baseline}\nready: {write_fp8_weights(baseline, models / FP8_NAME)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
