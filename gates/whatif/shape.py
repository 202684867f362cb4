"""A model's shape from its config.json and a stage's format from its axes: bytes and FLOPs per token."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infra.errors import SpecError
from infra.kv_axis import quantized_share

# What a weight-only or weight-and-activation format stores per scale, by (type, bits).
_SCALE_BYTES = {"int": 2, "float": 4}  # INT4/INT8 groups: bf16 scales; FP8: fp32 scales


class ModelShape(BaseModel):
    """A dense decoder-only transformer (Llama / Qwen / Mistral family)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    tied_embeddings: bool

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        """Read the fields of a Hugging Face config.json (text_config for multimodal wrappers)."""
        config = config.get("text_config") or config
        missing = [
            key
            for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                        "intermediate_size", "vocab_size")
            if key not in config
        ]
        if missing:
            raise SpecError(f"config.json lacks {', '.join(missing)}: not a dense decoder model")
        if config.get("num_local_experts") or config.get("num_experts"):
            raise SpecError("config.json describes a mixture-of-experts model; the what-if is dense only")
        heads = int(config["num_attention_heads"])
        return cls(
            hidden_size=int(config["hidden_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    @property
    def layer_matmuls(self) -> dict[str, int]:
        """Weights of each of one layer's matmuls, by its module name under model.layers.N (as
        Hugging Face names a Llama-family layer's)."""
        attention, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        mlp = self.hidden_size * self.intermediate_size
        return {"self_attn.q_proj": self.hidden_size * attention,
                "self_attn.k_proj": self.hidden_size * kv, "self_attn.v_proj": self.hidden_size * kv,
                "self_attn.o_proj": attention * self.hidden_size,
                "mlp.gate_proj": mlp, "mlp.up_proj": mlp, "mlp.down_proj": mlp}

    @property
    def layer_linear_params(self) -> int:
        """Weights of one layer's matmuls: q, k, v, o and the gated MLP (norms, biases left out)."""
        return sum(self.layer_matmuls.values())

    @property
    def body_params(self) -> int:
        """All decoder layers' matmul weights: what a quantizer quantizes."""
        return self.num_layers * self.layer_linear_params

    @property
    def head_params(self) -> int:
        """The LM head's weights (read every step even when tied to the embedding)."""
        return self.vocab_size * self.hidden_size

    @property
    def parameter_count(self) -> int:
        embedding = self.vocab_size * self.hidden_size
        return self.body_params + embedding + (0 if self.tied_embeddings else self.head_params)

    def attention_flops(self, past_tokens: float, new_tokens: float) -> float:
        """QKᵀ and PV FLOPs of `new_tokens` causal queries after `past_tokens` cached ones."""
        pairs = new_tokens * past_tokens + new_tokens * (new_tokens + 1) / 2
        return 4.0 * self.num_layers * self.num_heads * self.head_dim * pairs

    def prefill_flops(self, prompt_tokens: int) -> float:
        """One prompt's prefill: body matmuls per token, attention over the context, one logit row."""
        return (
            2.0 * self.body_params * prompt_tokens
            + self.attention_flops(0, prompt_tokens)
            + 2.0 * self.head_params
        )

    def decode_flops(self, context_tokens: int) -> float:
        """One generated token at `context_tokens` of context."""
        return (
            2.0 * (self.body_params + self.head_params)
            + self.attention_flops(context_tokens, 1)
        )


class StageFormat(BaseModel):
    """What a stage's axes mean for speed: bytes per weight, KV bytes, the matmul dtype."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weight_bytes_per_param: float = Field(description="Body weights, scales included.")
    head_bytes_per_param: float = Field(
        default=2.0, description="LM head and embeddings stay bf16 (quantizers ignore lm_head)."
    )
    kv_bytes_per_element: float = Field(description="2 for bf16, 1 for FP8.")
    compute_dtype: str = Field(description="dtype the body matmuls run in: bf16, fp8, int8, fp4.")
    note: str = Field(default="", description="How the axes were read, for the report.")

    def weight_bytes(self, shape: ModelShape) -> float:
        """Bytes of weights a forward pass streams (the input embedding is a lookup)."""
        return (
            shape.body_params * self.weight_bytes_per_param
            + shape.head_params * self.head_bytes_per_param
        )

    def resident_weight_bytes(self, shape: ModelShape) -> float:
        """Bytes of weights held in device memory, embedding table included."""
        embedding = 0 if shape.tied_embeddings else shape.vocab_size * shape.hidden_size
        return self.weight_bytes(shape) + embedding * self.head_bytes_per_param

    def kv_bytes_per_token(self, shape: ModelShape) -> float:
        return 2.0 * shape.num_layers * shape.num_kv_heads * shape.head_dim * self.kv_bytes_per_element


_FORMAT = re.compile(
    r"^(?P<type>int|float|fp|nvfp|mxfp)(?P<bits>\d+)(/(?P<strategy>[a-z_]+)(?P<size>[\dx]*))?"
)


def _weight_bytes(weights: str, hidden_size: int) -> tuple[float, str]:
    """(bytes per body weight including scales, how) for an axes weights value."""
    if weights in ("none", "", "bf16", "bfloat16", "float16"):
        return 2.0, "bf16 weights"
    if "+" in weights:
        raise SpecError(f"mixed weight formats {weights!r} and no share of each: the what-if "
                        "places them by a compressed-tensors checkpoint's config groups")
    match = _FORMAT.match(weights)
    if not match:
        raise SpecError(
            f"weights axis {weights!r} not understood; expected e.g. 'int4/group128', "
            "'float8/channel', 'float4/tensor_group', 'none'"
        )
    kind, bits = match["type"], int(match["bits"])
    strategy, size = match["strategy"] or "tensor", match["size"] or ""
    data = bits / 8
    if kind != "int" and bits == 4:  # NVFP4: group 16, FP8 scales; MXFP4: group 32, E8M0 scales
        group = int(size) if size.isdigit() else 16
        return data + 1.0 / group, f"FP4 weights, 1-byte scale per {group}"
    scale = _SCALE_BYTES["int" if kind == "int" else "float"]
    if strategy == "group":
        group = int(size) if size.isdigit() else 128
        per_weight = scale / group * (2 if "/asym" in weights else 1)
        return data + per_weight, f"{kind}{bits} weights, {scale}-byte scale per group of {group}"
    if strategy == "block":
        rows, _, cols = size.partition("x")
        block = int(rows or 128) * int(cols or rows or 128)
        return data + scale / block, f"{kind}{bits} weights, scale per {block}-weight block"
    if strategy == "channel":
        return data + scale / hidden_size, f"{kind}{bits} weights, scale per channel"
    return data, f"{kind}{bits} weights, per-tensor scale"


def _compute_dtype(activations: str) -> str:
    if activations in ("none", "", "bf16"):
        return "bf16"
    match = _FORMAT.match(activations)
    if not match:
        raise SpecError(f"activations axis {activations!r} not understood; e.g. 'float8/token/dynamic'")
    kind, bits = match["type"], int(match["bits"])
    if bits == 4:
        return "fp4" if kind != "int" else "int4"
    if bits == 8:
        return "int8" if kind == "int" else "fp8"
    raise SpecError(f"activations axis {activations!r}: only 8- and 4-bit activations are modelled")


def stage_format(axes: dict[str, Any], shape: ModelShape) -> StageFormat:
    """A stage's format from its axes (flows.axes.Axes as a dict: weights, activations, kv_cache;
    `weight_mix`, where present, each weight format's share of a mixed checkpoint's matmuls)."""
    weights = str(axes.get("weights", "none"))
    activations = str(axes.get("activations", "none"))
    kv_cache = str(axes.get("kv_cache", "auto"))
    mix = axes.get("weight_mix")
    if mix:  # a mixed checkpoint (flows.axes.weight_mix): each format on its share
        parts = {fmt: _weight_bytes(fmt, shape.hidden_size)[0] for fmt in mix}
        bytes_per_param = sum(share * parts[fmt] for fmt, share in mix.items())
        how = "mixed weights: " + ", ".join(
            f"{'bf16' if fmt == 'none' else fmt} on {share:.0%}" for fmt, share in mix.items())
    else:
        bytes_per_param, how = _weight_bytes(weights, shape.hidden_size)
    compute = _compute_dtype(activations)
    fp8 = kv_cache.startswith(("fp8", "float8"))
    if kv_cache not in ("auto", "none", "bf16") and not fp8:
        raise SpecError(f"kv_cache axis {kv_cache!r} not understood; expected 'auto' or an fp8 variant")
    share = quantized_share(kv_cache, shape.num_layers) if fp8 else 0.0
    kv = share * 1.0 + (1 - share) * 2.0  # fp8 on the quantized layers, bf16 on skipped ones
    kv_note = ("fp8" if share == 1 else "bf16" if share == 0
               else f"fp8 on {share:.0%} of the layers, bf16 on the rest")
    note = f"{how}; matmuls in {compute}; KV {kv_note}"
    return StageFormat(
        weight_bytes_per_param=bytes_per_param,
        kv_bytes_per_element=kv,
        compute_dtype=compute,
        note=note,
    )
