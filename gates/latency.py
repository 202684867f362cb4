"""Load rules: request errors and latency of a stage against its reference."""

from __future__ import annotations

import numpy as np

from gates import stats
from gates.policy import GatePolicy
from gates.record import StageRecord
from gates.verdict import Check, Status, judged, missing


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
        return missing(rule, metric)
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
        return [missing("load", "load")]
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


