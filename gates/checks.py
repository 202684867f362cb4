"""Gate checks: pure functions of a stage's record, its parent's and the baseline's."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from evalsets.results import PerplexityRatio, QualityItem, TaskQuality
from gates import stats
from gates.policy import GatePolicy, precision_class
from gates.record import StageRecord
from gates.verdict import Check, Status


def _missing(rule: str, what: str, required: bool = True) -> Check:
    if required:
        return Check(rule=rule, passed=False, reason=f"{what} was not measured: fail closed")
    return Check(rule=rule, passed=True, status="inconclusive", required=False,
                 reason=f"{what} was not measured (rule not required: advisory)")


def judged(rule: str, outcome: Status, required: bool, reason: str, **fields) -> Check:
    """A check whose outcome came from a bound: inconclusive blocks only when required."""
    passed = outcome in ("pass", "n/a") or (outcome == "inconclusive" and not required)
    if outcome == "inconclusive":
        reason = ("inconclusive, counts as rollback: " if required else
                  "inconclusive (advisory, rule not required): ") + reason
    return Check(rule=rule, passed=passed, status=outcome, required=required, reason=reason,
                 **fields)


def _pairs(first: TaskQuality, second: TaskQuality | None) -> list[tuple[QualityItem, QualityItem]]:
    """Items of both, matched by id, in `first`'s order."""
    if second is None:
        return []
    theirs = {item.id: item for item in second.items}
    return [(item, theirs[item.id]) for item in first.items if item.id in theirs]


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


@dataclass
class SetStats:
    """Paired accuracy statistics of one set (or one long-context bucket) of one stage."""

    rule: str
    n: int
    baseline_accuracy: float
    stage_accuracy: float
    difference: stats.Interval  # stage - baseline, per item, paired
    broke: int  # vs the parent: correct -> wrong
    fixed: int  # vs the parent: wrong -> correct
    p_worse: float  # exact McNemar vs the parent: did this step break items?
    p_worse_baseline: float  # exact McNemar vs the baseline: guards the bootstrap's tail
    discordance: float
    margin: float
    mde: float
    needed: int

    def details(self, p_holm: float, p_holm_baseline: float) -> dict[str, float | int | str | None]:
        return {
            "n": self.n, "baseline_accuracy": self.baseline_accuracy,
            "stage_accuracy": self.stage_accuracy, "difference": self.difference.estimate,
            "ci_low": self.difference.low, "ci_high": self.difference.high,
            "margin": self.margin, "recovery_low": self._recovery(self.difference.low),
            "broke": self.broke, "fixed": self.fixed, "p_mcnemar": self.p_worse,
            "p_holm": p_holm, "p_mcnemar_baseline": self.p_worse_baseline,
            "p_holm_baseline": p_holm_baseline, "mde": self.mde, "items_needed": self.needed,
        }

    def _recovery(self, difference: float) -> float | None:
        if self.baseline_accuracy <= 0:
            return None
        return 1 + difference / self.baseline_accuracy


def _set_stats(
    rule: str,
    vs_baseline: list[tuple[QualityItem, QualityItem]],
    vs_parent: list[tuple[QualityItem, QualityItem]],
    recovery: float,
    policy: GatePolicy,
) -> SetStats:
    q = policy.quality
    base = np.array([b.score >= 0.5 for b, _ in vs_baseline], dtype=float)
    mine = np.array([s.score >= 0.5 for _, s in vs_baseline], dtype=float)
    difference = stats.mean_ci(mine - base, q.confidence, q.bootstrap_resamples, q.seed)
    broke = sum(1 for p, s in vs_parent if p.score >= 0.5 > s.score)
    fixed = sum(1 for p, s in vs_parent if p.score < 0.5 <= s.score)
    n = len(vs_baseline)
    discordance = max(float(np.mean(mine != base)), q.planning_discordance)
    margin = (1 - recovery) * float(base.mean())
    return SetStats(
        rule=rule, n=n, baseline_accuracy=float(base.mean()), stage_accuracy=float(mine.mean()),
        difference=difference, broke=broke, fixed=fixed,
        p_worse=stats.mcnemar_worse(broke, fixed),
        p_worse_baseline=stats.mcnemar_worse(int(np.sum(base > mine)), int(np.sum(mine > base))),
        discordance=discordance, margin=margin,
        mde=stats.paired_mde(n, discordance, q.confidence, q.power),
        needed=stats.items_needed(margin, discordance, q.confidence, q.power),
    )


def _set_check(s: SetStats, p_holm: float, p_holm_baseline: float, recovery: float,
               required: bool, policy: GatePolicy) -> Check:
    q = policy.quality
    d = s.difference
    reason = (
        f"accuracy {s.stage_accuracy:.3f} vs baseline {s.baseline_accuracy:.3f}: paired diff "
        f"{_pts(d.estimate)} pts, {q.confidence:.0%} CI [{_pts(d.low)}, {_pts(d.high)}], "
        f"margin -{100 * s.margin:.1f} pts (recovery {recovery}); "
        f"flips vs parent {s.broke} correct->wrong, {s.fixed} wrong->correct "
        f"(McNemar p={s.p_worse:.3g}, Holm {p_holm:.3g}); n={s.n}, MDE {100 * s.mde:.1f} pts"
    )
    fields = {"value": d.low, "limit": -s.margin, "details": s.details(p_holm, p_holm_baseline)}
    if p_holm < q.alpha:
        return judged(s.rule, "fail", required,
                      f"significantly more correct->wrong flips (Holm p < {q.alpha}): " + reason,
                      **fields)
    # A bootstrap of a few discordant items has too thin a tail to prove harm on its own: a set is
    # inferior only when the exact McNemar test against the baseline agrees.
    if d.high < -s.margin and p_holm_baseline < q.alpha:
        return judged(s.rule, "fail", required,
                      "worse than the tolerance even at the upper bound: " + reason, **fields)
    if d.low >= -s.margin:
        return judged(s.rule, "pass", required, "non-inferior: " + reason, **fields)
    return judged(s.rule, "inconclusive", required,
                  reason + f"; the set would need ~{s.needed:,} items to bound the margin",
                  **fields)


def quality_checks(
    stage: StageRecord, parent: StageRecord, baseline: StageRecord, policy: GatePolicy
) -> list[Check]:
    """Per set: McNemar flips vs the parent (Holm) and non-inferiority vs the baseline; per bucket."""
    q = policy.quality
    if stage.quality is None or parent.quality is None or baseline.quality is None:
        return [_missing("quality", "quality")]
    recovery = policy.tolerance(precision_class(stage.axes)).recovery
    checks: list[Check] = []
    measured: list[tuple[SetStats, bool]] = []
    for name, parent_task in parent.quality.tasks.items():
        rule = f"quality.{name}"
        task = stage.quality.tasks.get(name)
        base_task = baseline.quality.tasks.get(name)
        if task is None or base_task is None:
            checks.append(_missing(rule, f"set {name!r}" + ("" if task else " on this stage")))
            continue
        vs_baseline, vs_parent = _pairs(base_task, task), _pairs(parent_task, task)
        n = min(len(vs_baseline), len(vs_parent))
        if n < q.min_items:
            checks.append(Check(
                rule=rule, passed=False, value=n, limit=q.min_items, details={"n": n},
                reason=f"only {n} paired items (< {q.min_items}): cannot decide, fail closed",
            ))
            continue
        measured.append((_set_stats(rule, vs_baseline, vs_parent, recovery, policy),
                         q.accuracy_required))
        groups = sorted({b.group for b, _ in vs_baseline if b.group}, key=natural_order)
        for group in groups:
            in_group = [(b, s) for b, s in vs_baseline if b.group == group]
            ids = {b.id for b, _ in in_group}
            in_parent = [(p, s) for p, s in vs_parent if s.id in ids]
            bucket = f"quality.{name}.{group}"  # per group: long-context buckets, business kinds
            if len(in_group) < q.min_items:
                checks.append(judged(
                    bucket, "inconclusive", q.long_context_required,
                    f"only {len(in_group)} paired items in bucket {group!r} (< {q.min_items})",
                    value=len(in_group), limit=q.min_items, details=_bucket_details(in_group),
                ))
                continue
            measured.append((_set_stats(bucket, in_group, in_parent, recovery, policy),
                             q.long_context_required))
    adjusted = stats.holm({s.rule: s.p_worse for s, _ in measured})
    adjusted_baseline = stats.holm({s.rule: s.p_worse_baseline for s, _ in measured})
    checks += [_set_check(s, adjusted[s.rule], adjusted_baseline[s.rule], recovery, required, policy)
               for s, required in measured]
    return checks


def _bucket_details(pairs: list[tuple[QualityItem, QualityItem]]) -> dict[str, float | int | None]:
    if not pairs:
        return {"n": 0}
    return {"n": len(pairs),
            "baseline_accuracy": float(np.mean([b.score >= 0.5 for b, _ in pairs])),
            "stage_accuracy": float(np.mean([s.score >= 0.5 for _, s in pairs]))}


def natural_order(label: str) -> tuple:
    """'2k' < '16k'; 'long' and 'short' alphabetically after the numbered ones."""
    digits = "".join(ch for ch in label if ch.isdigit())
    scale = 1000 if label.lower().rstrip("s").endswith("k") else 1
    return (0, int(digits) * scale, label) if digits else (1, 0, label)


def divergence_checks(stage: StageRecord, policy: GatePolicy) -> list[Check]:
    """KL and top-1 agreement against the baseline, on the same token positions."""
    required = policy.divergence.required
    div = stage.quality.divergence if stage.quality else None
    if div is None:
        return [_missing("divergence", "KL divergence / top-1 agreement vs the baseline", required)]
    precision = precision_class(stage.axes)
    tol = policy.tolerance(precision)
    conf = policy.quality.confidence
    if div.kl_ci_low is not None and div.kl_ci_high is not None:
        low, high, how = div.kl_ci_low, div.kl_ci_high, f"{conf:.0%} CI"
    else:
        low = high = div.mean_kl
        how = "no CI recorded: point estimate"
    outcome: Status = "pass" if high <= tol.max_kl else "fail" if low > tol.max_kl else "inconclusive"
    kl = judged(
        "divergence.kl", outcome, required,
        f"mean KL {div.mean_kl:.4f} nats/token ({how} [{low:.4f}, {high:.4f}]) over {div.tokens} "
        f"tokens, limit {tol.max_kl} ({precision})",
        value=high, limit=tol.max_kl,
        details={"mean_kl": div.mean_kl, "ci_low": low, "ci_high": high, "tokens": div.tokens},
    )
    if div.tokens < 1:
        return [kl, _missing("divergence.top1", "top-1 agreement", required)]
    agree = stats.proportion_ci(round(div.top1_agreement * div.tokens), div.tokens, conf)
    outcome = ("pass" if agree.low >= tol.min_top1 else "fail" if agree.high < tol.min_top1
               else "inconclusive")
    top1 = judged(
        "divergence.top1", outcome, required,
        f"top-1 agreement {div.top1_agreement:.2%} ({conf:.0%} CI [{agree.low:.2%}, "
        f"{agree.high:.2%}]) over {div.tokens} tokens, limit >= {tol.min_top1:.0%} ({precision})",
        value=agree.low, limit=tol.min_top1,
        details={"top1": div.top1_agreement, "ci_low": agree.low, "ci_high": agree.high,
                 "tokens": div.tokens},
    )
    return [kl, top1]


def _ppl_check(rule: str, ppl: float, ref: float, paired: PerplexityRatio | None, limit: float,
               against: str) -> Check:
    """Fails when even the low end of the paired increase is over the limit, passes when the
    high end is within it; in between the corpus cannot tell (perplexity rules are required)."""
    if paired is not None and paired.ci_low is not None and paired.ci_high is not None:
        increase, low, high = paired.ratio - 1, paired.ci_low - 1, paired.ci_high - 1
        how = f"paired over {paired.tokens} tokens, 95 % CI [{low:+.1%}, {high:+.1%}]"
    else:
        increase = low = high = ppl / ref - 1
        how = "no paired CI recorded: point estimate"
    outcome: Status = "pass" if high <= limit else "fail" if low > limit else "inconclusive"
    return judged(
        rule, outcome, True,
        f"perplexity {ppl:.3f} vs {against} {ref:.3f} ({increase:+.1%}, {how}; "
        f"limit +{limit:.0%})",
        value=increase, limit=limit,
        details={"perplexity": ppl, "reference": ref, "ci_low": low, "ci_high": high},
    )


def perplexity_checks(
    stage: StageRecord, parent: StageRecord, baseline: StageRecord, policy: GatePolicy
) -> list[Check]:
    values = [r.quality.perplexity if r.quality else None for r in (stage, parent, baseline)]
    if any(v is None or not math.isfinite(v) for v in values):
        return [_missing("perplexity", "perplexity")]
    ppl, parent_ppl, base_ppl = values
    rules = policy.perplexity
    quality = stage.quality
    vs_parent = quality.perplexity_vs_parent or (
        quality.perplexity_vs_baseline if parent.name == baseline.name else None)
    checks = [_ppl_check("perplexity.parent", ppl, parent_ppl, vs_parent,
                         rules.max_increase_vs_parent, "parent")]
    if parent.name != baseline.name:
        checks.append(_ppl_check("perplexity.baseline", ppl, base_ppl,
                                 quality.perplexity_vs_baseline,
                                 rules.max_increase_vs_baseline, "baseline"))
    return checks


def _latency_samples(record: StageRecord, level: str, metric: str) -> np.ndarray:
    if record.load is None:
        return np.array([])
    name = "tpot_ms" if metric.startswith("tpot") else "ttft_ms"
    values = [getattr(s, name) for s in record.load.samples.get(level, []) if not s.error]
    return np.array([v for v in values if v is not None and v > 0], dtype=float)


def _latency_check(stage: StageRecord, parent: StageRecord, metric: str, limit: float,
                   policy: GatePolicy) -> Check:
    rules = policy.latency
    rule = f"latency.{rules.level}.{metric}"
    mine = stage.load.summaries.get(rules.level) if stage.load else None
    theirs = parent.load.summaries.get(rules.level) if parent.load else None
    now = getattr(mine, metric, None) if mine else None
    before = getattr(theirs, metric, None) if theirs else None
    if not now or not before:
        return _missing(rule, metric)
    ours, base = (_latency_samples(r, rules.level, metric) for r in (stage, parent))
    if len(ours) >= 10 and len(base) >= 10:
        q = policy.quality
        ci = stats.median_ratio_ci(ours, base, q.confidence, q.bootstrap_resamples, q.seed)
        outcome: Status = ("fail" if ci.low > limit else "pass" if ci.estimate <= limit
                           else "inconclusive")
        return judged(
            rule, outcome, rules.required,
            f"median {metric[:4]} {np.median(ours):.1f} ms vs {parent.name} {np.median(base):.1f} ms "
            f"({ci.estimate:+.1%}, {q.confidence:.0%} CI [{ci.low:+.1%}, {ci.high:+.1%}] over "
            f"{len(ours)}/{len(base)} requests; limit +{limit:.0%})",
            value=ci.estimate, limit=limit,
            details={"increase": ci.estimate, "ci_low": ci.low, "ci_high": ci.high,
                     "stage_ms": now, "parent_ms": before},
        )
    increase = now / before - 1
    return Check(
        rule=rule, passed=increase <= limit, value=increase, limit=limit,
        details={"increase": increase, "stage_ms": now, "parent_ms": before},
        reason=f"{metric} {now:.1f} vs {parent.name} {before:.1f} ({increase:+.1%}, limit +{limit:.0%}; "
        f"only {len(ours)}/{len(base)} raw samples (< 10): point estimate)",
    )


def error_rate_checks(stage: StageRecord, policy: GatePolicy) -> list[Check]:
    """Per level: errors within the stricter of the policy's and the load profile's limit."""
    limits = [policy.load.max_error_rate, stage.load.max_error_rate]
    limit = min(x for x in limits if x is not None)
    checks = []
    for level, summary in stage.load.summaries.items():
        measured = summary.requests > 0
        checks.append(Check(
            rule=f"load.{level}.errors", passed=measured and summary.error_rate <= limit,
            value=summary.error_rate, limit=limit,
            reason=f"{summary.errors}/{summary.requests} requests failed "
            f"({summary.error_rate:.1%}, limit {limit:.0%})" if measured
            else "no request was measured: fail closed",
        ))
    return checks


def load_checks(
    stage: StageRecord, parent: StageRecord, baseline: StageRecord, policy: GatePolicy
) -> list[Check]:
    if stage.load is None or not stage.load.summaries:
        return [_missing("load", "load")]
    checks = error_rate_checks(stage, policy)
    rules = policy.latency
    if stage.emulated:
        return checks + [Check(
            rule=f"latency.{rules.level}", passed=True, applicable=False,
            reason=f"not gated: {stage.name} serves dequantized (emulated) weights, so its speed "
            "is not representative",
        )]
    # An emulated parent's speed means nothing: judge against the baseline, which was served as is.
    reference = baseline if parent.emulated else parent
    return checks + [
        _latency_check(stage, reference, "tpot_p50_ms", rules.max_tpot_p50_increase, policy),
        _latency_check(stage, reference, "ttft_p50_ms", rules.max_ttft_p50_increase, policy),
    ]


def length_ratios(stage: StageRecord, parent: StageRecord) -> dict[str, np.ndarray]:
    """Per set: log(stage tokens / parent tokens) over items both answered with a length."""
    out: dict[str, np.ndarray] = {}
    if stage.quality is None or parent.quality is None:
        return out
    for name, parent_task in parent.quality.tasks.items():
        pairs = _pairs(parent_task, stage.quality.tasks.get(name))
        out[name] = np.array([math.log(s.output_tokens / p.output_tokens) for p, s in pairs
                              if s.output_tokens and p.output_tokens], dtype=float)
    return out


def length_checks(stage: StageRecord, parent: StageRecord, policy: GatePolicy) -> list[Check]:
    """The CI of the paired mean log length ratio (all sets) must stay within 1 ± max_change."""
    if stage.quality is None or parent.quality is None:
        return [_missing("length", "output length")]
    rules, q = policy.length, policy.quality
    per_set = length_ratios(stage, parent)
    ratios = np.concatenate(list(per_set.values())) if per_set else np.array([])
    if len(ratios) < q.min_items:
        return [Check(rule="length", passed=False, value=len(ratios), limit=q.min_items,
                      reason=f"only {len(ratios)} paired responses with lengths: cannot decide, "
                      "fail closed")]
    ci = stats.mean_ci(ratios, q.confidence, q.bootstrap_resamples, q.seed)
    low, high = rules.log_bounds
    holm = stats.holm({name: stats.wilcoxon_p(r) for name, r in per_set.items() if len(r)})
    outcome: Status = ("pass" if low <= ci.low and ci.high <= high else
                       "fail" if ci.low > high or ci.high < low else "inconclusive")
    wilcoxon = ", ".join(f"{name} p={p:.3g}" for name, p in holm.items())
    details: dict[str, float | int | str | None] = {
        "n": len(ratios), "mean_log_ratio": ci.estimate, "ci_low": ci.low, "ci_high": ci.high,
        "changed": int(np.count_nonzero(ratios)),
    } | {f"wilcoxon_holm.{name}": p for name, p in holm.items()}
    checks = [judged(
        "length", outcome, rules.required,
        f"paired length ratio x{math.exp(ci.estimate):.3f} ({q.confidence:.0%} CI "
        f"[x{math.exp(ci.low):.3f}, x{math.exp(ci.high):.3f}]) over {len(ratios)} responses, "
        f"{details['changed']} changed length; Wilcoxon (Holm) {wilcoxon}; limit "
        f"x{1 - rules.max_change:.2f}..x{1 + rules.max_change:.2f}",
        value=ci.estimate, limit=high, details=details,
    )]
    return checks + [_finish_check(stage, parent, policy)]


def _finish_check(stage: StageRecord, parent: StageRecord, policy: GatePolicy) -> Check:
    """The share of responses cut off at the generation budget (finish=length) must not rise."""
    rules, q = policy.length, policy.quality
    pairs = [pair for name, task in parent.quality.tasks.items()
             for pair in _pairs(task, stage.quality.tasks.get(name))
             if pair[0].finish_reason and pair[1].finish_reason]
    if len(pairs) < q.min_items:
        return _missing("length.finish", "finish_reason", rules.finish_required)
    before = np.array([p.finish_reason == "length" for p, _ in pairs], dtype=float)
    after = np.array([s.finish_reason == "length" for _, s in pairs], dtype=float)
    ci = stats.mean_ci(after - before, q.confidence, q.bootstrap_resamples, q.seed)
    limit = rules.max_length_finish_increase
    outcome: Status = "pass" if ci.high <= limit else "fail" if ci.low > limit else "inconclusive"
    return judged(
        "length.finish", outcome, rules.finish_required,
        f"cut off at the budget: {after.mean():.1%} vs parent {before.mean():.1%} "
        f"({_pts(ci.estimate)} pts, {q.confidence:.0%} CI [{_pts(ci.low)}, {_pts(ci.high)}]); "
        f"limit +{100 * limit:.0f} pts",
        value=ci.estimate, limit=limit,
        details={"stage_rate": float(after.mean()), "parent_rate": float(before.mean()),
                 "ci_low": ci.low, "ci_high": ci.high, "n": len(pairs)},
    )


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
    stage: StageRecord, parent: StageRecord, baseline: StageRecord, policy: GatePolicy
) -> list[Check]:
    if stage.error:
        return [Check(rule="stage", passed=False, reason=f"stage did not finish: {stage.error}")]
    if parent.error:
        return [Check(rule="stage", passed=False,
                      reason=f"parent {parent.name!r} did not finish: nothing to compare with")]
    return (
        quality_checks(stage, parent, baseline, policy)
        + divergence_checks(stage, policy)
        + perplexity_checks(stage, parent, baseline, policy)
        + load_checks(stage, parent, baseline, policy)
        + length_checks(stage, parent, policy)
        + [engine_check(stage, parent, baseline)]
    )
