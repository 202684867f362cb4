"""Gate checks: pure functions of a stage's record, its parent's and the baseline's."""

from __future__ import annotations

from collections.abc import Mapping

from gates.accuracy import at_sizes, quality_checks
from gates.comparability_check import comparability_check
from gates.divergence import divergence_checks, perplexity_checks
from gates.latency import load_checks
from gates.length import length_checks
from gates.policy import GatePolicy
from gates.record import StageRecord
from gates.verdict import Check


def _ratio(now: float | None, before: float | None) -> float | None:
    return now / before if now and before else None


def bought(stage: StageRecord, parent: StageRecord, baseline: StageRecord) -> dict[str, float | None]:
    """What the stage bought: engine facts and throughput as ratios to the parent and baseline."""
    out: dict[str, float | None] = {}
    for name, ref in (("parent", parent), ("baseline", baseline)):
        for fact in ("weight_bytes", "kv_cache_tokens"):
            out[f"{fact}_vs_{name}"] = _ratio(
                getattr(stage.facts, fact, None) if stage.facts else None,
                getattr(ref.facts, fact, None) if ref.facts else None)
    for level in ("low", "high"):
        mine = stage.load.summaries.get(level) if stage.load else None
        theirs = parent.load.summaries.get(level) if parent.load else None
        for figure in ("output_tokens_per_s", "tpot_p50_ms", "ttft_p50_ms"):
            out[f"{level}.{figure}_vs_parent"] = _ratio(getattr(mine, figure, None),
                                                        getattr(theirs, figure, None))
    return out


def engine_check(stage: StageRecord, parent: StageRecord, baseline: StageRecord) -> Check:
    """Shown, not gated: engine-fact differences and what the stage bought."""
    gains = bought(stage, parent, baseline)
    shown = [f"{key.replace('_vs_', ' vs ')} x{value:.2f}" for key, value in gains.items()
             if value is not None and not key.startswith("low.") and "ttft" not in key]
    note = " (emulated: speed not representative)" if stage.emulated else ""
    return Check(rule="engine", passed=True, applicable=False, details=gains,
                 reason=("; ".join(shown) or "no engine facts recorded") + note)


def stage_checks(
    stage: StageRecord, parent: StageRecord, baseline: StageRecord, policy: GatePolicy,
    records: Mapping[str, StageRecord] | None = None,
) -> list[Check]:
    """`records`: every stage by name, so that cumulative rules can walk the whole chain."""
    if stage.error:
        return [Check(rule="stage", passed=False, reason=f"stage did not finish: {stage.error}")]
    if parent.error:
        return [Check(rule="stage", passed=False,
                      reason=f"parent {parent.name!r} did not finish: nothing to compare with")]
    # Judged on its own items: those it answered later as a served-again parent are its child's.
    own = stage.quality.own_sizes if stage.quality is not None else None
    stage = stage if own is None else at_sizes(stage, own)
    # Asked the same way as the baseline first: the other rules mean nothing otherwise.
    return (
        [comparability_check(stage, baseline)]
        + quality_checks(stage, parent, baseline, policy)
        + divergence_checks(stage, policy)
        + perplexity_checks(stage, parent, baseline, policy)
        + load_checks(stage, parent, baseline, policy, records)
        + length_checks(stage, parent, policy, baseline)
        + [engine_check(stage, parent, baseline)]
    )
