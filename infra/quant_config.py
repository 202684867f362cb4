"""What a checkpoint's quantization_config may hold: the types and ranges compressed-tensors (and
vLLM's GPTQ, AWQ and fp8 loaders) accept, checked before any engine reads them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from infra.errors import did_you_mean
from infra.jsonfile import shown_value

# compressed-tensors' QuantizationStrategy, QuantizationType and ActivationOrdering values.
STRATEGIES = ("tensor", "channel", "group", "block", "token", "tensor_group", "attn_head")
TYPES = ("int", "float")
ACTORDERS = ("group", "weight", "dynamic", "static")
DYNAMIC_STRATEGIES = ("token", "tensor", "tensor_group", "group")
# Bit widths: compressed-tensors packs int weights of 2 to 8 bits (vLLM's WNA16), floats are fp4
# (e2m1) or fp8 (e4m3); vLLM's GPTQ (Marlin) takes 4 or 8 bits, its AWQ 4.
INT_BITS = range(2, 9)
FLOAT_BITS = (4, 8)
GPTQ_BITS = (4, 8)
AWQ_BITS = (4,)
FP8_ACTIVATION_SCHEMES = ("static", "dynamic")
KV_STRATEGIES = ("tensor", "attn_head")  # what vLLM's compressed-tensors KV cache takes
# compressed-tensors' CompressionFormat and QuantizationStatus values (the same in 0.17, which vLLM
# loads with, and 0.19, which llmcompressor writes with).
FORMATS = ("dense", "sparse-bitmask", "sparse-24-bitmask", "int-quantized", "float-quantized",
           "naive-quantized", "pack-quantized", "marlin-24", "mixed-precision",
           "nvfp4-pack-quantized", "mxfp4-pack-quantized", "mxfp8-quantized")
STATUSES = ("initialized", "calibration", "frozen", "compressed", "decompressed")
EMULATED_EXAMPLE = ('{"method": "dequantized", "source": ..., "quantization_config": {...}}, as '
                    "infra/make_candidates.py writes it")


class _Bad(Exception):
    """One problem: the field (a dotted path) and what is wrong with its value, with the fix."""

    def __init__(self, field: str, text: str) -> None:
        super().__init__(f"{field} {text}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _object(value: Any, field: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(field, f"is {shown_value(value)}, not an object; {what}")
    return value


def _choice(args: Mapping[str, Any], key: str, field: str, choices: tuple[str, ...],
            default: str | None, fold_case: bool = True) -> str | None:
    """One of compressed-tensors' enum values; its args fold the case (QuantizationArgs'
    validators), its config's format and status do not."""
    value = args.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Bad(f"{field}.{key}", f"is {shown_value(value)}; write one of "
                   f"{', '.join(map(json.dumps, choices))}")
    if (value.lower() if fold_case else value) not in choices:
        raise _Bad(f"{field}.{key}", f"is {json.dumps(value)}; {did_you_mean(value, choices)}")
    return value.lower()


def _flag(args: Mapping[str, Any], key: str, field: str) -> None:
    if key in args and args[key] is not None and not isinstance(args[key], bool):
        raise _Bad(f"{field}.{key}", f"is {shown_value(args[key])}; write true or false")


def _bits(value: Any, field: str, valid: tuple[int, ...] | range, what: str) -> int:
    choices = (f"{valid.start} to {valid.stop - 1}" if isinstance(valid, range)
               else " or ".join(map(str, valid)))
    if value is None:
        raise _Bad(field, f"is missing (or null); {what} needs its number of bits: {choices}")
    if not _is_int(value):
        hint = f": write {value.strip()}" if isinstance(value, str) and value.strip().isdigit() else ""
        raise _Bad(field, f"is {shown_value(value)}, not an integer number of bits{hint}")
    if value not in valid:
        # Wider than 8 bits is no quantization at all: such layers belong in `ignore`.
        hint = ("; layers kept in the model dtype go in the config's ignore list" if value > 8
                else "")
        raise _Bad(field, f"is {value}; {what} takes {choices} bits{hint}")
    return value


def _group_size(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or value < -1 or value == 0:
        raise _Bad(field, f"is {shown_value(value)}; write a positive group size (e.g. 128), or -1 "
                   "for one scale per channel")
    return value


def check_args(args: Mapping[str, Any], field: str, kv_cache: bool = False) -> None:
    """One compressed-tensors QuantizationArgs (weights, input/output activations, KV cache),
    with the same rules its pydantic model applies (and vLLM's, for the KV cache)."""
    kind = _choice(args, "type", field, TYPES, "int")
    valid = FLOAT_BITS if kind == "float" else INT_BITS
    _bits(args.get("num_bits", 8), f"{field}.num_bits", valid, f"compressed-tensors type {kind!r}")
    _flag(args, "symmetric", field)
    group_size = _group_size(args.get("group_size"), f"{field}.group_size")
    strategy = _choice(args, "strategy", field, STRATEGIES, None)
    if strategy is None:  # compressed-tensors infers it from group_size
        strategy = "tensor" if group_size is None else ("group" if group_size > 0 else "channel")
    if strategy in ("group", "tensor_group") and (group_size is None or group_size <= 0):
        raise _Bad(f"{field}.group_size", f"is {shown_value(group_size)}, but strategy {strategy!r} "
                   "needs a positive group size (e.g. 128)")
    if group_size is not None and group_size > 0 and strategy not in ("group", "tensor_group"):
        raise _Bad(f"{field}.strategy", f"is {strategy!r} with group_size {group_size}; set "
                   "strategy \"group\" or drop group_size")
    block = args.get("block_structure")
    if block is not None and not (isinstance(block, list) and len(block) == 2
                                  and all(_is_int(n) and n > 0 for n in block)):
        raise _Bad(f"{field}.block_structure", f"is {shown_value(block)}; write two positive "
                   "integers [rows, cols], e.g. [128, 128]")
    if (strategy == "block") != (block is not None):
        raise _Bad(f"{field}.strategy", f"is {strategy!r} with block_structure "
                   f"{shown_value(block)}; the block strategy and a block_structure go together")
    dynamic = args.get("dynamic", False)
    if not (isinstance(dynamic, bool) or dynamic == "local"):
        raise _Bad(f"{field}.dynamic", f"is {shown_value(dynamic)}; write true, false or \"local\"")
    if strategy == "token" and not dynamic:
        raise _Bad(f"{field}.dynamic", "is false with strategy \"token\"; per-token scales are "
                   "computed at run time: set dynamic true")
    if dynamic and strategy not in DYNAMIC_STRATEGIES:
        raise _Bad(f"{field}.dynamic", f"is {json.dumps(dynamic)} with strategy {strategy!r}; "
                   f"dynamic quantization takes strategy {', '.join(DYNAMIC_STRATEGIES)}")
    if dynamic == "local" and strategy != "tensor_group":
        raise _Bad(f"{field}.dynamic", f"is \"local\" with strategy {strategy!r}; \"local\" "
                   "takes strategy \"tensor_group\"")
    actorder = args.get("actorder")
    if actorder is not None and not isinstance(actorder, bool):
        _choice(args, "actorder", field, ACTORDERS, None)
    if (actorder is True or actorder in ("group", "dynamic")) and \
            strategy not in ("group", "tensor_group"):
        raise _Bad(f"{field}.actorder", f"is {json.dumps(actorder)} with strategy {strategy!r}; "
                   "group activation ordering takes strategy \"group\"")
    if args.get("observer") is not None and not isinstance(args["observer"], str):
        raise _Bad(f"{field}.observer", f"is {shown_value(args['observer'])}; write an observer "
                   "name (e.g. \"minmax\") or null")
    if args.get("observer_kwargs") is not None:
        _object(args["observer_kwargs"], f"{field}.observer_kwargs", "write {} or leave it out")
    if kv_cache and (kind != "float" or args.get("num_bits", 8) != 8 or strategy not in
                     KV_STRATEGIES):
        raise _Bad(field, f"is {kind}{args.get('num_bits', 8)}/{strategy}; vLLM quantizes the "
                   "KV cache to float 8 bits only, with strategy \"tensor\" or \"attn_head\"")


def _strings(value: Any, field: str, what: str) -> None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _Bad(field, f"is {shown_value(value)}; write a list of {what}")


def _compressed_tensors(qc: Mapping[str, Any], field: str) -> None:
    groups = qc.get("config_groups")
    if isinstance(groups, list):
        raise _Bad(f"{field}.config_groups", "is a list; compressed-tensors takes an object of "
                   "named schemes, e.g. {\"group_0\": {\"targets\": [\"Linear\"], ...}}")
    groups = _object(groups, f"{field}.config_groups", "write an object of named schemes, e.g. "
                     "{\"group_0\": {\"targets\": [\"Linear\"], \"weights\": {...}}}")
    if not groups:
        raise _Bad(f"{field}.config_groups", "is empty; a compressed-tensors checkpoint names at "
                   "least one scheme")
    for name, group in groups.items():
        where = f"{field}.config_groups.{name}"
        group = _object(group, where, "write a scheme with targets, weights, input_activations")
        _strings(group.get("targets"), f"{where}.targets", "the layers it applies to, e.g. "
                 "[\"Linear\"]")
        _choice(group, "format", where, FORMATS, None, fold_case=False)
        for role in ("weights", "input_activations", "output_activations"):
            args = group.get(role)
            if args is not None:
                check_args(_object(args, f"{where}.{role}", "write the scheme's arguments "
                                   "(num_bits, type, strategy, ...) or null"), f"{where}.{role}")
    kv = qc.get("kv_cache_scheme")
    if kv is not None:
        check_args(_object(kv, f"{field}.kv_cache_scheme", "write the KV cache scheme's "
                           "arguments, e.g. {\"type\": \"float\", \"num_bits\": 8, \"strategy\": "
                           "\"tensor\"}, or null"), f"{field}.kv_cache_scheme", kv_cache=True)
    if qc.get("ignore") is not None:
        _strings(qc["ignore"], f"{field}.ignore", "layer names, e.g. [\"lm_head\"]")
    _choice(qc, "format", field, FORMATS, None, fold_case=False)
    _choice(qc, "quantization_status", field, STATUSES, None, fold_case=False)
    for key in ("sparsity_config", "transform_config"):
        if qc.get(key) is not None:
            _object(qc[key], f"{field}.{key}", "write {} or null")


def _group_size_of(qc: Mapping[str, Any], keys: tuple[str, ...], field: str, method: str) -> None:
    key = next((k for k in keys if k in qc), None)
    if key is None:
        raise _Bad(f"{field}.{keys[-1]}", f"is missing; vLLM's {method} loader needs it (e.g. "
                   "128, or -1 for one scale per channel)")
    _group_size(qc[key], f"{field}.{key}")


def check_quantization_config(qc: Any, field: str = "quantization_config") -> None:
    """Raise _Bad for the first value its loader would refuse; methods quantgate does not know
    are left to the caller (flows/axes.py names the supported ones)."""
    qc = _object(qc, field, "write the object the quantizer wrote (with quant_method), or "
                 "remove the key for an unquantized model")
    if not qc:
        raise _Bad(field, "is empty ({}); remove it for an unquantized model, or write the "
                   "quantizer's config (with quant_method)")
    method = qc.get("quant_method")
    if not isinstance(method, str):
        shown = shown_value(method) if method is not None else "missing"
        raise _Bad(f"{field}.quant_method", f"is {shown}; write the method, e.g. "
                   "\"compressed-tensors\", \"gptq\", \"awq\" or \"fp8\"")
    method = method.lower()
    if method == "compressed-tensors":
        _compressed_tensors(qc, field)
    elif method in ("gptq", "gptq_marlin"):
        _bits(qc.get("bits"), f"{field}.bits", GPTQ_BITS, "GPTQ")
        _group_size_of(qc, ("group_size",), field, "GPTQ")
        _flag(qc, "desc_act", field)
        _flag(qc, "sym", field)
    elif method in ("awq", "awq_marlin"):
        key = "w_bit" if "w_bit" in qc else "bits"
        _bits(qc.get(key), f"{field}.{key}", AWQ_BITS, "AWQ")
        _group_size_of(qc, ("q_group_size", "group_size"), field, "AWQ")
        _flag(qc, "zero_point", field)
    elif method == "fp8":
        scheme = qc.get("activation_scheme")
        if scheme not in FP8_ACTIVATION_SCHEMES:
            shown = shown_value(scheme) if scheme is not None else "missing"
            raise _Bad(f"{field}.activation_scheme", f"is {shown}; write \"dynamic\" or \"static\"")
        block = qc.get("weight_block_size")
        if block is not None and not (isinstance(block, list) and len(block) == 2
                                      and all(_is_int(n) and n > 0 for n in block)):
            raise _Bad(f"{field}.weight_block_size", f"is {shown_value(block)}; write two positive "
                       "integers, e.g. [128, 128], or null")
        if block is not None and scheme != "dynamic":
            raise _Bad(f"{field}.activation_scheme", f"is {json.dumps(scheme)} with "
                       "weight_block_size; vLLM's block-wise fp8 takes \"dynamic\" only")


def quantization_config_problem(qc: Any, field: str = "quantization_config") -> str | None:
    """What is wrong with a quantization_config, as `field value; fix`, or None."""
    try:
        check_quantization_config(qc, field)
    except _Bad as bad:
        return str(bad)
    return None


def quantization_problem(config: Mapping[str, Any]) -> str | None:
    """What is wrong with a config.json's quantization_config or quantgate_emulated (the
    dequantized twin's record of its source's config), or None when the loaders accept both."""
    try:
        if config.get("quantization_config") is not None:
            check_quantization_config(config["quantization_config"])
        emulated = config.get("quantgate_emulated")
        if emulated is not None:
            emulated = _object(emulated, "quantgate_emulated", f"write {EMULATED_EXAMPLE}, or "
                               "remove the key")
            if emulated.get("quantization_config") is None:
                raise _Bad("quantgate_emulated.quantization_config", "is missing (or null); it holds the "
                           "quantized source's quantization_config, which gives the stage its axes "
                           f"({EMULATED_EXAMPLE})")
            check_quantization_config(emulated["quantization_config"],
                                      "quantgate_emulated.quantization_config")
    except _Bad as bad:
        return str(bad)
    return None
