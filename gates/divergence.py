"""Divergence rules: KL, top-1 agreement and perplexity against the baseline on the same tokens."""

from __future__ import annotations

import math

from evalsets.results import PerplexityRatio
from gates import stats
from gates.policy import GatePolicy, precision_class
from gates.record import StageRecord
from gates.verdict import Check, Status, judged, missing


def divergence_checks(stage: StageRecord, policy: GatePolicy) -> list[Check]:
    """KL and top-1 agreement against the baseline, on the same token positions."""
    required = policy.divergence.required
    div = stage.quality.divergence if stage.quality else None
    if div is None:
        return [missing("divergence", "KL divergence / top-1 agreement vs the baseline", required)]
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
        return [kl, missing("divergence.top1", "top-1 agreement", required)]
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
        return [missing("perplexity", "perplexity")]
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


