"""Divergence rules: KL, top-1 agreement and perplexity against the baseline on the same tokens.

Every interval is computed here, from the per-token values the stage stored
(`QualityResult.paired_tokens`), by one block bootstrap (gates.stats) with the policy's level,
resamples and seed: the same stored records always give the same verdict. A record without
per-token values never passes on a point estimate: the rule is inconclusive (a rollback when
required), and so is one whose corpus has fewer blocks than `divergence.min_blocks`.
"""

from __future__ import annotations

import math

import numpy as np

from evalsets.results import PairedTokens
from gates import stats
from gates.policy import GatePolicy, precision_class
from gates.record import StageRecord
from gates.verdict import Check, Status, judged, missing


def _interval(tokens: PairedTokens, series: str, policy: GatePolicy) -> stats.Interval | None:
    values = tokens.values(series)
    if values is None:
        return None
    quality = policy.quality
    return stats.block_bootstrap(values, tokens.span_tokens, policy.divergence.block_tokens,
                                 quality.confidence, quality.bootstrap_resamples, quality.seed)


def _how(tokens: PairedTokens, policy: GatePolicy) -> str:
    block_tokens = policy.divergence.block_tokens
    count = stats.corpus_blocks(tokens.span_tokens, block_tokens)
    return (f"{policy.quality.confidence:.0%} studentized block-bootstrap CI over {tokens.tokens} "
            f"tokens in {len(tokens.spans)} spans, {count} block{'s' * (count != 1)} of <= "
            f"{block_tokens}")


def _too_short(tokens: PairedTokens, policy: GatePolicy) -> str | None:
    """Why the corpus cannot decide (too few blocks to resample), or None when it can."""
    rules = policy.divergence
    count = stats.corpus_blocks(tokens.span_tokens, rules.block_tokens)
    if count >= rules.min_blocks:
        return None
    return (f"the scoring corpus has {count} block{'s' * (count != 1)} of <= {rules.block_tokens} "
            f"tokens, fewer than divergence.min_blocks = {rules.min_blocks}: too few to bound a "
            f"heavy-tailed per-token mean; score a longer corpus (>= {rules.min_blocks} blocks, "
            f"e.g. {rules.min_blocks * rules.block_tokens:,} tokens in texts of >= "
            f"{rules.block_tokens} tokens)")


def coarsening(top_k: int) -> str:
    return f"top-{top_k} coarsened KL, a lower bound of the full-vocabulary KL"


def kl_upper(stage: StageRecord, policy: GatePolicy) -> float | None:
    """The upper bound of `stage`'s KL interval against the baseline, as divergence.kl reads it
    (0 for the baseline itself); None where the stage stored no per-token KL."""
    if stage.parent is None:
        return 0.0
    tokens = stage.quality.paired_tokens if stage.quality else None
    interval = _interval(tokens, "kl", policy) if tokens is not None else None
    return None if interval is None else interval.high


def divergence_checks(stage: StageRecord, policy: GatePolicy) -> list[Check]:
    """KL and top-1 agreement against the baseline, on the same token positions."""
    required = policy.divergence.required
    quality = stage.quality
    div = quality.divergence if quality else None
    tokens = quality.paired_tokens if quality else None
    if div is None and (tokens is None or tokens.kl is None):
        return [missing("divergence", "KL divergence / top-1 agreement vs the baseline", required)]
    if tokens is None or tokens.kl is None or tokens.top1_agree is None:
        shown = f" (point estimates: KL {div.mean_kl:.4f}, top-1 {div.top1_agreement:.2%})" if div else ""
        return [judged("divergence", "inconclusive", required,
                       f"KL divergence / top-1 agreement vs the baseline recorded without per-token "
                       f"values{shown}: no interval can be computed, and a point estimate never passes")]
    precision = precision_class(stage.axes)
    tol = policy.tolerance(precision)
    how = _how(tokens, policy)
    short = _too_short(tokens, policy)
    kl = _interval(tokens, "kl", policy)
    outcome: Status = ("inconclusive" if short else "pass" if kl.high <= tol.max_kl
                       else "fail" if kl.low > tol.max_kl else "inconclusive")
    kl_check = judged(
        "divergence.kl", outcome, required,
        (f"{short}; " if short else "")
        + f"mean KL {kl.estimate:.4f} nats/token ({coarsening(tokens.top_k)}; {how}: "
        f"[{kl.low:.4f}, {kl.high:.4f}]), limit {tol.max_kl} ({precision})",
        value=kl.high, limit=tol.max_kl,
        details={"mean_kl": kl.estimate, "ci_low": kl.low, "ci_high": kl.high,
                 "tokens": tokens.tokens, "top_k": tokens.top_k},
    )
    agree = _interval(tokens, "top1_agree", policy)
    outcome = ("inconclusive" if short else "pass" if agree.low >= tol.min_top1
               else "fail" if agree.high < tol.min_top1 else "inconclusive")
    top1_check = judged(
        "divergence.top1", outcome, required,
        (f"{short}; " if short else "")
        + f"top-1 agreement {agree.estimate:.2%} (most likely token read from the top-{tokens.top_k} "
        f"lists, the same coarsened view as the KL; {how}: [{agree.low:.2%}, {agree.high:.2%}]), "
        f"limit >= {tol.min_top1:.1%} ({precision})",
        value=agree.low, limit=tol.min_top1,
        details={"top1": agree.estimate, "ci_low": agree.low, "ci_high": agree.high,
                 "tokens": tokens.tokens, "top_k": tokens.top_k},
    )
    return [kl_check, top1_check]


def _ppl_check(rule: str, ppl: float, ref: float, tokens: PairedTokens | None, series: str,
               limit: float, against: str, policy: GatePolicy) -> Check:
    """Fails when even the low end of the paired increase is over the limit, passes when the
    high end is within it; in between the corpus cannot tell (perplexity rules are required)."""
    values = tokens.values(series) if tokens is not None else None
    if values is None:
        return judged(
            rule, "inconclusive", True,
            f"perplexity {ppl:.3f} vs {against} {ref:.3f} ({ppl / ref - 1:+.1%} point estimate) "
            f"without per-token NLL differences: no paired interval, and a point estimate never "
            f"passes (limit +{limit:.0%})",
            details={"perplexity": ppl, "reference": ref, "point_increase": ppl / ref - 1},
        )
    quality = policy.quality
    log_ratio = stats.block_bootstrap(values, tokens.span_tokens, policy.divergence.block_tokens,
                                      quality.confidence, quality.bootstrap_resamples, quality.seed)
    increase, low, high = (math.exp(x) - 1 for x in (log_ratio.estimate, log_ratio.low,
                                                      log_ratio.high))
    short = _too_short(tokens, policy)
    outcome: Status = ("inconclusive" if short else "pass" if high <= limit
                       else "fail" if low > limit else "inconclusive")
    return judged(
        rule, outcome, True,
        (f"{short}; " if short else "")
        + f"perplexity {ppl:.3f} vs {against} {ref:.3f} (paired per token: {increase:+.1%}, "
        f"{_how(tokens, policy)}: [{low:+.1%}, {high:+.1%}]; limit +{limit:.0%})",
        value=increase, limit=limit,
        details={"perplexity": ppl, "reference": ref, "ci_low": low, "ci_high": high,
                 "tokens": int(np.asarray(values).size)},
    )


def perplexity_checks(
    stage: StageRecord, parent: StageRecord, baseline: StageRecord, policy: GatePolicy
) -> list[Check]:
    values = [r.quality.perplexity if r.quality else None for r in (stage, parent, baseline)]
    if any(v is None or not math.isfinite(v) for v in values):
        return [missing("perplexity", "perplexity")]
    ppl, parent_ppl, base_ppl = values
    rules = policy.perplexity
    tokens = stage.quality.paired_tokens
    # The first stage's parent is the baseline: the same pair, stored once.
    vs_parent = "nll_diff_vs_baseline" if parent.name == baseline.name else "nll_diff_vs_parent"
    checks = [_ppl_check("perplexity.parent", ppl, parent_ppl, tokens, vs_parent,
                         rules.max_increase_vs_parent, "parent", policy)]
    if parent.name != baseline.name:
        checks.append(_ppl_check("perplexity.baseline", ppl, base_ppl, tokens,
                                 "nll_diff_vs_baseline", rules.max_increase_vs_baseline,
                                 "baseline", policy))
    return checks
