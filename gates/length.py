"""Output-length rules: paired length ratio and the share of answers cut off at the budget."""

from __future__ import annotations

import math

import numpy as np

from gates import stats
from gates.policy import GatePolicy
from gates.record import StageRecord, paired_items
from gates.verdict import Check, Status, judged, missing, points


def length_ratios(stage: StageRecord, parent: StageRecord) -> dict[str, np.ndarray]:
    """Per set: log((stage tokens + 1) / (parent tokens + 1)) over items with known lengths.

    The +1 keeps empty answers in: a stage that answers nothing is the largest drift of all,
    not a pair to skip. A pair whose parent answer was cut at the budget is left out: its true
    length is unknown (only "at least the budget"), and any change can only shorten it, which
    would read as drift. A stage cut where its parent stopped stays in (a lower bound of its
    growth), and the share cut off is judged by length.finish."""
    out: dict[str, np.ndarray] = {}
    if stage.quality is None or parent.quality is None:
        return out
    for name, parent_task in parent.quality.tasks.items():
        pairs = paired_items(parent_task, stage.quality.tasks.get(name))
        out[name] = np.array([math.log((s.output_tokens + 1) / (p.output_tokens + 1))
                              for p, s in pairs
                              if s.output_tokens is not None and p.output_tokens is not None
                              and p.finish_reason != "length"],
                             dtype=float)
    return out


def length_checks(stage: StageRecord, parent: StageRecord, policy: GatePolicy) -> list[Check]:
    """The CI of the paired mean log length ratio (all sets) must stay within 1 ± max_change."""
    if stage.quality is None or parent.quality is None:
        return [missing("length", "output length")]
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
        f"{details['changed']} changed length (pairs whose parent was cut at the budget left out: "
        f"censored); Wilcoxon (Holm) {wilcoxon}; limit "
        f"x{1 - rules.max_change:.2f}..x{1 + rules.max_change:.2f}",
        value=ci.estimate, limit=high, details=details,
    )]
    return checks + [_finish_check(stage, parent, policy)]


def _finish_check(stage: StageRecord, parent: StageRecord, policy: GatePolicy) -> Check:
    """The share of responses cut off at the generation budget (finish=length) must not rise."""
    rules, q = policy.length, policy.quality
    pairs = [pair for name, task in parent.quality.tasks.items()
             for pair in paired_items(task, stage.quality.tasks.get(name))
             if pair[0].finish_reason and pair[1].finish_reason]
    if len(pairs) < q.min_items:
        return missing("length.finish", "finish_reason", rules.finish_required)
    before = np.array([p.finish_reason == "length" for p, _ in pairs], dtype=float)
    after = np.array([s.finish_reason == "length" for _, s in pairs], dtype=float)
    ci = stats.mean_ci(after - before, q.confidence, q.bootstrap_resamples, q.seed)
    limit = rules.max_length_finish_increase
    outcome: Status = "pass" if ci.high <= limit else "fail" if ci.low > limit else "inconclusive"
    return judged(
        "length.finish", outcome, rules.finish_required,
        f"cut off at the budget: {after.mean():.1%} vs parent {before.mean():.1%} "
        f"({points(ci.estimate)} pts, {q.confidence:.0%} CI [{points(ci.low)}, {points(ci.high)}]); "
        f"limit +{100 * limit:.0f} pts",
        value=ci.estimate, limit=limit,
        details={"stage_rate": float(after.mean()), "parent_rate": float(before.mean()),
                 "ci_low": ci.low, "ci_high": ci.high, "n": len(pairs)},
    )


