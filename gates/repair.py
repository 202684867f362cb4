"""The repairs a diagnosis weighs: configurations near the failed one, with their bytes.

A failed integer weight format is repaired by spending bytes where the diagnosis found the loss
(ModelOpt's `auto_quantize` and Neural Compressor's autotune, inside the sign-off): the costliest
decoder layers or module kinds kept in bf16 or INT8 per channel, a finer group size, both; and
INT8 per channel everywhere as the plain fallback. Each option's weight bytes come from the
model's own shapes (scales as bf16, one per group or output channel). flows/diagnose.py measures
options by emulation, a bisection within each family (`families`: the loss falls as a family's
bytes rise), and the cheapest whose KL interval lies under its target is built and served as a
stage of kind `repair`. A failed FP8 KV cache is repaired the way the engine can serve it:
E4M3 for E5M2 (one more mantissa bit, the same bytes), its costliest layers' cache kept in the
model dtype (vLLM's --kv-cache-dtype-skip-layers), priced in KV bytes per token, what it takes
back of the cache's capacity. Nothing here runs a model.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from gates.policy import GatePolicy
from gates.whatif.shape import ModelShape, stage_format
from infra.kv_axis import split_skipped, with_skipped
from infra.sensitivity import parse_format

SCALE_BITS = 16  # one bf16 scale per group (or per output channel)
KEPT_LAYERS = (1, 2, 3, 4, 6, 8, 12, 16, 20, 24)  # costliest layers kept, as options
MIN_GROUP = 16  # the finest group size offered
FALLBACK = "int8/channel"  # also the higher precision a kept group may get
KEPT_AS = ("bf16", FALLBACK)
KV_MORE_MANTISSA = {"fp8_e5m2": "fp8_e4m3"}  # the same bytes, a finer step (less range)
# The emulated KL a repair may reach, as a share of the limit: the engine then judges it by an
# interval on its own corpus and answers, which must clear the limit, and length and accuracy
# move with it (the demo's W4A16 repair chosen at the whole limit, emulated KL 0.036 [0.029,
# 0.042], served perplexity +4.5 % [+3.8, +5.3] against +5 %: inconclusive, a rollback).
TARGET_SHARE = 0.5
# A plain format (one scheme on every linear) within this share of the cheapest passing option's
# bytes is chosen instead: one kernel, no per-module plan to keep right, and its loss measured.
PLAIN_WITHIN = 0.05


class Emulated(BaseModel):
    """An option's emulated KL (nats per scored token) with its interval, once measured."""

    mean_kl: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    target: float | None = Field(None, description="The KL it must stay under (its precision's).")


class RepairOption(Emulated):
    """One configuration: `weights` on every decoder linear but the kept ones (the costliest
    layers, or module kinds across all layers), which get `kept_as`; its weight bytes, and once
    measured its emulated KL."""

    weights: str = Field(description="The format on the quantized layers, as the axes name it.")
    kept_layers: list[int] = Field(default_factory=list, description="Decoder layers kept.")
    kept_kinds: list[str] = Field(default_factory=list, description="Module kinds kept.")
    kept_as: str = Field("bf16", description="'bf16' (the parent's precision) or 'int8/channel'.")
    bytes: int = Field(description="Weight bytes of the whole model in this configuration.")

    @property
    def name(self) -> str:
        kept = (f"layers {', '.join(map(str, self.kept_layers))}" if self.kept_layers
                else ", ".join(self.kept_kinds))
        return f"{self.weights}, {kept} as {self.kept_as}" if kept else self.weights

    def keeps(self, layer: int, kind: str) -> bool:
        return layer in self.kept_layers or kind in self.kept_kinds


class KvRepairOption(Emulated):
    """A KV-cache repair: the failed stage's cache format on every layer but `skip_layers`, which
    keep the model dtype (vLLM's --kv-cache-dtype-skip-layers: engine flags, nothing to build);
    its KV bytes per token, and once measured its emulated KL."""

    kv_cache: str = Field(description="The cache format, as the kv_cache axis names it: the failed "
                          "stage's, or E4M3 for a failed E5M2 ('fp8_e4m3').")
    skip_layers: list[int] = Field(description="Decoder layers whose cache keeps the model dtype.")
    bytes: int = Field(description="KV-cache bytes per token of the whole model, the skipped "
                       "layers in bf16 as it ships (kv_bytes).")

    @property
    def name(self) -> str:
        kept = ", ".join(map(str, self.skip_layers))
        return f"{self.kv_cache} KV cache" + (f", model dtype on layers {kept}" if kept else "")

    @property
    def axis(self) -> str:
        """The repair stage's kv_cache axis (infra.kv_axis)."""
        return with_skipped(self.kv_cache, self.skip_layers)


def kv_bytes(shape: ModelShape, kv_cache: str) -> int:
    """K and V of every layer for one token in the `kv_cache` axis's format: what the what-if
    counts (gates.whatif.shape: fp8 one byte an element, bf16's two on the skipped layers)."""
    return round(stage_format({"kv_cache": kv_cache}, shape).kv_bytes_per_token(shape))


def kv_families(shape: ModelShape, failed: str,
                layer_ranking: list[int]) -> list[list[KvRepairOption]]:
    """The options in families, each cheapest first, along which the loss should fall as bytes
    rise: the costliest layers (`layer_ranking`) kept in the model dtype, 1, 2, 3, 4, 6, ... of
    them, in the failed format; and where it is E5M2 (two mantissa bits), E4M3 in its bytes
    (three), alone and with layers kept. Keeping every layer is the parent's cache, not a repair."""
    base, skipped = split_skipped(failed)
    formats = [base, *([KV_MORE_MANTISSA[base]] if base in KV_MORE_MANTISSA else [])]
    families = [[KvRepairOption(kv_cache=fmt, skip_layers=sorted(skipped),
                                bytes=kv_bytes(shape, with_skipped(fmt, skipped)))]
                for fmt in formats[1:]]
    for fmt in formats:
        family = []
        for k in KEPT_LAYERS:
            kept = sorted({*skipped, *layer_ranking[:k]})
            if len(kept) < shape.num_layers and len(layer_ranking) >= k:
                family.append(KvRepairOption(kv_cache=fmt, skip_layers=kept,
                                             bytes=kv_bytes(shape, with_skipped(fmt, kept))))
        families.append(family)
    return [family for family in families if family]


Option = RepairOption | KvRepairOption  # what a diagnosis measures and chooses


class LayerParams(BaseModel):
    """Per decoder layer, its linears' input and output widths (in `kinds` order), and every
    other parameter (embeddings, norms, an untied head), kept at 16 bits."""

    kinds: list[str]
    in_features: list[list[int]]
    out_features: list[list[int]]
    other: int


def _bits(fmt: str) -> tuple[int, int | None]:
    """(bits, group size or None) of a format as the axes name it (infra.sensitivity's parser:
    every option is one it can fake-quantize)."""
    parsed = parse_format(fmt)
    return parsed.bits, parsed.group_size


def _linear_bits(fmt: str, width: int, rows: int) -> int:
    if fmt == "bf16":
        return 16 * width * rows
    bits, group = _bits(fmt)
    return bits * width * rows + SCALE_BITS * rows * (math.ceil(width / group) if group else 1)


def weight_bytes(params: LayerParams, option: RepairOption) -> int:
    """The model's weight bytes in the option's configuration."""
    total = 16 * params.other
    for layer, (ins, outs) in enumerate(zip(params.in_features, params.out_features, strict=True)):
        for kind, width, rows in zip(params.kinds, ins, outs, strict=True):
            fmt = option.kept_as if option.keeps(layer, kind) else option.weights
            total += _linear_bits(fmt, width, rows)
    return total // 8


def options(params: LayerParams, failed: str, layer_ranking: list[int],
            kind_ranking: list[str]) -> list[RepairOption]:
    """Every option, cheapest first: the failed format and each finer group size, with the
    costliest layers (`layer_ranking`: 1, 2, 3, 4, 6, ...) or module kinds (1, 2, ...) kept in
    bf16 or 8-bit; and 8-bit per channel everywhere. The failed configuration itself is left
    out: it was measured."""
    bits, group = _bits(failed)
    formats = [failed]
    if group is not None:
        finer = group // 2
        while finer >= MIN_GROUP:
            formats.append(f"int{bits}/group{finer}")
            finer //= 2
    layers = len(params.in_features)
    kept = ([{"kept_layers": sorted(layer_ranking[:k])} for k in KEPT_LAYERS if k < layers]
            + [{"kept_kinds": kind_ranking[:k]} for k in range(1, len(kind_ranking))])
    found = [RepairOption(weights=fmt, bytes=0) for fmt in formats[1:]]
    found += [RepairOption(weights=fmt, kept_as=kept_as, bytes=0, **which)
              for fmt in formats for kept_as in KEPT_AS for which in kept
              if kept_as == "bf16" or _bits(kept_as)[0] > bits]
    if bits < _bits(FALLBACK)[0]:
        found.append(RepairOption(weights=FALLBACK, bytes=0))
    for option in found:
        option.bytes = weight_bytes(params, option)
    return sorted(found, key=lambda option: option.bytes)


def families(found: list[RepairOption]) -> list[list[RepairOption]]:
    """The options in families along which the loss should fall as bytes rise (each cheapest
    first): one format with more layers kept, or more module kinds, in one precision; and the
    formats alone (finer groups, then 8-bit). The search bisects within a family."""
    by_family: dict[tuple, list[RepairOption]] = {}
    for option in found:
        which = "layers" if option.kept_layers else "kinds" if option.kept_kinds else "none"
        key = ("none",) if which == "none" else (option.weights, option.kept_as, which)
        by_family.setdefault(key, []).append(option)
    return [sorted(family, key=lambda o: o.bytes) for family in by_family.values()]


def target_kl(policy: GatePolicy, precision: str, spent: float = 0.0,
              parent: str = "") -> tuple[float, str]:
    """The emulated full-vocabulary KL a repair may add, and why: `TARGET_SHARE` of the divergence
    limit or of the perplexity limit read as KL (a mean log-likelihood loss of ln(1 + increase)
    nats per token is that increase in perplexity), whichever is smaller. The emulated KL is the
    full vocabulary's, an upper bound of the top-k KL the divergence rule reads.

    The divergence rule reads the stage against the baseline, and the emulation measures what an
    option adds over its parent's formats: a parent that already `spent` KL against the baseline
    (its served interval's upper bound) leaves the option only the rest of the divergence limit.
    A parent that spent it all leaves 0: no option of this stage can pass."""
    kl = policy.tolerance(precision).max_kl
    room = max(kl - spent, 0.0)
    ppl = math.log1p(policy.perplexity.max_increase_vs_parent)
    share = f"{TARGET_SHARE:.0%} of "
    if ppl < room:
        return TARGET_SHARE * ppl, (
            f"{share}ln(1 + {policy.perplexity.max_increase_vs_parent:.0%}) = {ppl:.4f}, the "
            "perplexity limit vs the parent read as KL: the served stage's interval must clear it")
    if spent > 0:
        return TARGET_SHARE * room, (
            f"{share}what the divergence.kl limit {kl} ({precision}) leaves after the KL that the "
            f"parent {parent} spends against the baseline (up to {spent:.4f} served): {room:.4f}; "
            "the served stage's interval must clear the limit")
    return TARGET_SHARE * kl, (f"{share}the divergence.kl limit {kl} ({precision}): the served "
                               "stage's interval must clear it")


def chosen(measured: list[Option]) -> tuple[Option | None, str]:
    """The repair to build among the options measured, and why: the cheapest that passes, or a
    plain one (nothing kept) that passes within PLAIN_WITHIN of its bytes."""
    passing = sorted((o for o in measured if passes(o)), key=lambda o: o.bytes)
    if not passing:
        return None, "no option measured lies under its target"
    cheapest = passing[0]
    plain = next((o for o in passing if isinstance(o, RepairOption)
                  and not o.kept_layers and not o.kept_kinds), None)
    if plain is not None and plain is not cheapest and plain.bytes <= cheapest.bytes * (1 + PLAIN_WITHIN):
        return plain, (f"a plain format within {PLAIN_WITHIN:.0%} of the cheapest passing option's "
                       f"bytes ({cheapest.name}, {plain.bytes / cheapest.bytes - 1:+.1%})")
    return cheapest, "the cheapest configuration whose KL interval lies under its target"


def passes(option: Option) -> bool:
    """Measured, and its whole KL interval under its target."""
    return option.ci_high is not None and option.target is not None and option.ci_high <= option.target

