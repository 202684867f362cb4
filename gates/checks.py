"""Gate checks: pure functions of a stage's record, its parent's and the baseline's."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from gates.policy import GatePolicy
from gates.record import StageRecord
from gates.verdict import Check


def _missing(rule: str, what: str) -> Check:
    return Check(rule=rule, passed=False, reason=f"{what} was not measured: fail closed")


def quality_checks(stage: StageRecord, parent: StageRecord, policy: GatePolicy) -> list[Check]:
    rules = policy.quality
    if stage.quality is None or parent.quality is None:
        return [_missing("quality", "quality")]
    checks = []
    for name, parent_task in parent.quality.tasks.items():
        rule = f"quality.{name}"
        task = stage.quality.tasks.get(name)
        if task is None:
            checks.append(_missing(rule, f"set {name!r}"))
            continue
        mine = {item.id: item.score for item in task.items}
        pairs = [(p.score, mine[p.id]) for p in parent_task.items if p.id in mine]
        if len(pairs) < rules.min_items:
            checks.append(Check(
                rule=rule, passed=False, value=len(pairs), limit=rules.min_items,
                reason=f"only {len(pairs)} paired items (< {rules.min_items}): cannot decide",
            ))
            continue
        before, after = np.array(pairs, dtype=float).T
        drop = float(before.mean() - after.mean())
        broke = int(np.sum((before >= 0.5) & (after < 0.5)))
        fixed = int(np.sum((before < 0.5) & (after >= 0.5)))
        # Exact McNemar: under no change each flip is equally likely to go either way.
        p_worse = stats.binomtest(broke, broke + fixed, 0.5, alternative="greater").pvalue if (
            broke + fixed
        ) else 1.0
        detail = (
            f"{after.mean():.3f} vs parent {before.mean():.3f} over {len(pairs)} items; "
            f"flips {broke} correct->wrong, {fixed} wrong->correct (McNemar p={p_worse:.3g})"
        )
        if drop > rules.max_accuracy_drop:
            checks.append(Check(rule=rule, passed=False, value=drop, limit=rules.max_accuracy_drop,
                                reason=f"accuracy dropped {drop:.3f} > {rules.max_accuracy_drop}: "
                                + detail))
        elif p_worse < rules.alpha:
            checks.append(Check(rule=rule, passed=False, value=p_worse, limit=rules.alpha,
                                reason=f"significantly worse (p < {rules.alpha}): " + detail))
        else:
            checks.append(Check(rule=rule, passed=True, value=drop, limit=rules.max_accuracy_drop,
                                reason=detail))
    return checks


def _ppl_check(rule: str, ppl: float, ref: float, limit: float, against: str) -> Check:
    increase = ppl / ref - 1
    return Check(
        rule=rule, passed=increase <= limit, value=increase, limit=limit,
        reason=f"perplexity {ppl:.3f} vs {against} {ref:.3f} ({increase:+.1%}, limit +{limit:.0%})",
    )


def perplexity_checks(
    stage: StageRecord, parent: StageRecord, baseline: StageRecord, policy: GatePolicy
) -> list[Check]:
    values = [r.quality.perplexity if r.quality else None for r in (stage, parent, baseline)]
    if any(v is None or not math.isfinite(v) for v in values):
        return [_missing("perplexity", "perplexity")]
    ppl, parent_ppl, base_ppl = values
    rules = policy.perplexity
    checks = [_ppl_check("perplexity.parent", ppl, parent_ppl, rules.max_increase_vs_parent,
                         "parent")]
    if parent.name != baseline.name:
        checks.append(_ppl_check("perplexity.baseline", ppl, base_ppl,
                                 rules.max_increase_vs_baseline, "baseline"))
    return checks


def load_checks(stage: StageRecord, parent: StageRecord, policy: GatePolicy) -> list[Check]:
    if stage.load is None or not stage.load.summaries:
        return [_missing("load", "load")]
    checks = []
    limit = policy.load.max_error_rate
    for level, summary in stage.load.summaries.items():
        checks.append(Check(
            rule=f"load.{level}.errors", passed=summary.error_rate <= limit,
            value=summary.error_rate, limit=limit,
            reason=f"{summary.errors}/{summary.requests} requests failed "
            f"({summary.error_rate:.1%}, limit {limit:.0%})",
        ))
    rules = policy.latency
    if stage.emulated or parent.emulated:
        who = stage.name if stage.emulated else f"parent {parent.name!r}"
        return checks + [Check(
            rule=f"latency.{rules.level}", passed=True, applicable=False,
            reason=f"not gated: {who} serves dequantized (emulated) weights, so speed is not "
            "representative",
        )]
    mine = stage.load.summaries.get(rules.level)
    theirs = parent.load.summaries.get(rules.level) if parent.load else None
    for metric, limit in (("tpot_p50_ms", rules.max_tpot_p50_increase),
                          ("ttft_p50_ms", rules.max_ttft_p50_increase)):
        rule = f"latency.{rules.level}.{metric}"
        now = getattr(mine, metric, None) if mine else None
        before = getattr(theirs, metric, None) if theirs else None
        if not now or not before:
            checks.append(_missing(rule, metric))
            continue
        increase = now / before - 1
        checks.append(Check(
            rule=rule, passed=increase <= limit, value=increase, limit=limit,
            reason=f"{metric} {now:.1f} vs parent {before:.1f} ({increase:+.1%}, limit +{limit:.0%})",
        ))
    return checks


def length_checks(stage: StageRecord, parent: StageRecord, policy: GatePolicy) -> list[Check]:
    if stage.quality is None or parent.quality is None:
        return [_missing("length", "output length")]
    ratios = []
    for name, parent_task in parent.quality.tasks.items():
        task = stage.quality.tasks.get(name)
        mine = {i.id: i.output_tokens for i in task.items} if task else {}
        for item in parent_task.items:
            now = mine.get(item.id)
            if now and item.output_tokens:
                ratios.append(math.log(now / item.output_tokens))
    limit = policy.length.max_abs_mean_log_ratio
    if len(ratios) < policy.quality.min_items:
        return [Check(rule="length", passed=False, value=len(ratios),
                      reason=f"only {len(ratios)} paired responses with lengths: cannot decide")]
    mean = float(np.mean(ratios))
    changed = sum(1 for r in ratios if r != 0)
    return [Check(
        rule="length", passed=abs(mean) <= limit, value=mean, limit=limit,
        reason=f"mean log length ratio {mean:+.3f} (x{math.exp(mean):.3f}) over {len(ratios)} "
        f"paired responses, {changed} changed length (limit ±{limit})",
    )]


def stage_checks(
    stage: StageRecord, parent: StageRecord, baseline: StageRecord, policy: GatePolicy
) -> list[Check]:
    if stage.error:
        return [Check(rule="stage", passed=False, reason=f"stage did not finish: {stage.error}")]
    if parent.error:
        return [Check(rule="stage", passed=False,
                      reason=f"parent {parent.name!r} did not finish: nothing to compare with")]
    return (
        quality_checks(stage, parent, policy)
        + perplexity_checks(stage, parent, baseline, policy)
        + load_checks(stage, parent, policy)
        + length_checks(stage, parent, policy)
    )
