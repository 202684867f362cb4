"""Load rules: request errors, and latency against the reference timed in interleaved rounds."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from gates import stats
from gates.policy import GatePolicy
from gates.record import StageRecord
from gates.verdict import Check, Status, judged, missing
from load.results import PairedLoad

METRICS = {"tpot_p50_ms": "tpot", "ttft_p50_ms": "ttft"}


@dataclass(frozen=True)
class Step:
    """One timed step: the per-round log ratios of a stage against its reference."""

    stage: str
    reference: str
    ratios: tuple[float, ...]
    rounds_run: int

    @property
    def mean(self) -> float:
        return float(np.mean(self.ratios))

    @property
    def variance(self) -> float:
        """Variance of the mean over rounds (s² / n)."""
        return float(np.var(self.ratios, ddof=1)) / len(self.ratios)

    @property
    def df(self) -> int:
        return len(self.ratios) - 1


def timed_step(record: StageRecord, level: str, metric: str) -> Step | None:
    """The record's paired rounds at `level`; None without paired rounds."""
    paired = record.paired_load
    if paired is None:
        return None
    ratios = paired.log_ratios(level, METRICS[metric])
    return Step(record.name, paired.reference, tuple(ratios), len(paired.rounds.get(level, [])))


def wants_more_rounds(paired: PairedLoad, level: str, policy: GatePolicy) -> bool:
    """Whether a required latency step is still unresolved on these rounds, within the budget.

    Judged as the step rule judges it (per-round log ratios, one-sided t bounds against the
    step's limit, TPOT and TTFT); the flow adds a round while this holds. Rounds that cannot
    resolve anything more (fewer than 2 usable) ask for more too."""
    rules = policy.latency
    if not rules.required or level != rules.level:
        return False
    looks, count = round_looks(policy), len(paired.rounds.get(level, []))
    if count >= looks[-1]:
        return False
    if count not in looks:
        return True  # on to the next planned look
    limits = {"tpot_p50_ms": rules.max_tpot_p50_increase,
              "ttft_p50_ms": rules.max_ttft_p50_increase}
    for metric, limit in limits.items():
        ratios = paired.log_ratios(level, METRICS[metric])
        if len(ratios) < 2:
            return True
        step = Step("stage", paired.reference, tuple(ratios), len(ratios))
        low, high = one_sided_bounds(step.mean, step.variance, step.df, look_confidence(policy))
        if _outcome(low, high, limit) == "inconclusive":
            return True
    return False


def one_sided_bounds(mean: float, variance: float, df: float, confidence: float) -> tuple[float, float]:
    """Lower and upper one-sided Student-t bounds of a mean, each at `confidence`."""
    if variance <= 0:
        return mean, mean
    half = float(scipy_stats.t.ppf(confidence, df)) * math.sqrt(variance)
    return mean - half, mean + half


def welch_df(steps: list[Step]) -> float:
    """Welch–Satterthwaite degrees of freedom of a sum of independent step means."""
    total = sum(s.variance for s in steps)
    denominator = sum(s.variance**2 / s.df for s in steps)
    return total**2 / denominator if denominator > 0 else math.inf


def _outcome(low: float, high: float, limit: float) -> Status:
    bound = math.log1p(limit)
    return "fail" if low > bound else "pass" if high <= bound else "inconclusive"


def _x(log_ratio: float) -> str:
    return f"x{math.exp(log_ratio):.3f}"


def _judge(rule: str, what: str, mean: float, variance: float, df: float, limit: float,
           policy: GatePolicy, extra: str, details: dict, confidence: float | None = None) -> Check:
    confidence = confidence or policy.quality.confidence
    low, high = one_sided_bounds(mean, variance, df, confidence)
    outcome = _outcome(low, high, limit)
    reason = (f"{what} {_x(mean)} ({math.expm1(mean):+.1%}; one-sided {confidence:.0%} "
              f"bounds [{_x(low)}, {_x(high)}], t df {df:.3g}; limit +{limit:.0%}){extra}")
    return judged(rule, outcome, policy.latency.required, reason, value=math.expm1(mean),
                  limit=limit, details={
                      "increase": math.expm1(mean), "ci_low": math.expm1(low),
                      "ci_high": math.expm1(high), "mean_log_ratio": mean,
                      "df": df if math.isfinite(df) else None} | details)


def _unusable(rule: str, step: Step, level: str) -> Check:
    return Check(
        rule=rule, passed=False, status="fail",
        reason=f"only {len(step.ratios)} of {step.rounds_run} interleaved rounds at level {level!r} "
        f"have requests on both sides (need 2 for an interval): fail closed",
    )


def contention(stage: StageRecord, policy: GatePolicy) -> tuple[float, str] | None:
    """The share others took of the box in the stage's most contended round and why that makes
    its timing contended (above what the policy allows), or None."""
    rules = policy.latency
    paired = stage.paired_load
    share = None if paired is None else paired.others_cpu_share(rules.level)
    if share is None or share <= rules.max_other_cpu_share:
        return None
    return share, (f"contended: processes outside the run took {share:.0%} of the box's CPU in a "
                   f"round of {stage.name} at level {rules.level!r} (limit "
                   f"{rules.max_other_cpu_share:.0%}, latency.max_other_cpu_share): timing on a "
                   "contended box is neither a pass nor a fail")


def _step_check(stage: StageRecord, step: Step, metric: str, limit: float, policy: GatePolicy) -> Check:
    level = policy.latency.level
    rule = f"latency.{level}.{metric}"
    if len(step.ratios) < 2:
        return _unusable(rule, step, level)
    contended = contention(stage, policy)
    if contended:
        share, why = contended
        return judged(rule, "inconclusive", policy.latency.required, why,
                      details={"others_cpu_share": share, "contended": True})
    paired = stage.paired_load
    looks = round_looks(policy)
    confidence = look_confidence(policy)
    check = None
    # Required: judged at each planned look on its first rounds; the first that decides stands.
    for count in [n for n in looks if n < len(step.ratios)] + [len(step.ratios)]:
        ratios = step.ratios[:count]
        part = Step(step.stage, step.reference, ratios, count)
        rounds = " ".join(_x(r) for r in ratios)
        extra = (f"; per round {rounds}, {paired.requests_per_round} requests per side and round, "
                 "both engines up, order alternating")
        if len(looks) > 1:
            extra += (f"; rounds added while unresolved, looks at {', '.join(map(str, looks))} "
                      "rounds, alpha split over them")
        check = _judge(rule, f"median {metric[:4]} vs {step.reference} over {count} "
                       "interleaved rounds:", part.mean, part.variance, part.df, limit, policy,
                       extra, {"rounds": count, "reference": step.reference}, confidence)
        if check.status in ("pass", "fail"):
            break
    return check


def round_looks(policy: GatePolicy, first: int = 3) -> list[int]:
    """Round counts at which a required step is judged: 3, 6, 12, ... up to max_rounds; one look
    (the profile's rounds) when latency is advisory."""
    if not policy.latency.required:
        return [first]
    looks = [first]
    while looks[-1] * 2 <= policy.latency.max_rounds:
        looks.append(looks[-1] * 2)
    return looks


def look_confidence(policy: GatePolicy) -> float:
    """One-sided confidence per look: alpha (1 - confidence) split over the planned looks."""
    return 1 - (1 - policy.quality.confidence) / len(round_looks(policy))


def _chain(stage: StageRecord, records: Mapping[str, StageRecord], baseline: str, level: str,
           metric: str) -> tuple[list[Step], str | None]:
    """Timed steps from the stage down to the baseline; or why the chain cannot be summed."""
    steps: list[Step] = []
    record: StageRecord | None = stage
    while record is not None and record.name != baseline:
        step = timed_step(record, level, metric)
        if step is None:
            return steps, f"{record.name} has no interleaved rounds against its reference"
        if len(step.ratios) < 2:
            return steps, f"{record.name} has {len(step.ratios)} usable rounds (< 2)"
        steps.append(step)
        if len(steps) > len(records) + 1:
            return steps, "the references form a cycle"
        record = records.get(step.reference)
        if record is None and step.reference != baseline:
            return steps, f"the record of {step.reference} (reference of {step.stage}) was not given"
    return steps, None


def _cumulative_check(stage: StageRecord, records: Mapping[str, StageRecord], baseline: str,
                      metric: str, step_limit: float, policy: GatePolicy) -> Check | None:
    rules = policy.latency
    limit = getattr(rules, f"max_{metric[:-3]}_increase_vs_baseline")
    rule = f"latency.{rules.level}.{metric}.baseline"
    steps, broken = _chain(stage, records, baseline, rules.level, metric)
    if broken:
        return judged(rule, "inconclusive", rules.required,
                      f"cumulative {metric[:4]} vs {baseline} not summed: {broken}")
    if len(steps) == 1 and limit >= step_limit:
        return None  # the reference is the baseline: the step check already is the cumulative one
    timed = dict(records) | {stage.name: stage}
    contended = [found for s in steps if s.stage in timed
                 and (found := contention(timed[s.stage], policy))]
    if contended:
        _, why = contended[0]
        return judged(rule, "inconclusive", rules.required,
                      f"cumulative {metric[:4]} vs {baseline}: {why}")
    mean = sum(s.mean for s in steps)
    variance = sum(s.variance for s in steps)
    path = " + ".join(f"{s.stage}/{s.reference} {_x(s.mean)}" for s in steps)
    return _judge(rule, f"cumulative median {metric[:4]} vs {baseline} over {len(steps)} timed "
                  "steps:", mean, variance, welch_df(steps), limit, policy, f"; steps {path}",
                  {"steps": len(steps)})


def _unpaired_check(stage: StageRecord, reference: StageRecord, metric: str, limit: float,
                    policy: GatePolicy) -> Check:
    """Today's comparison of two separate runs: at best inconclusive, since drift is unbounded."""
    rules = policy.latency
    rule = f"latency.{rules.level}.{metric}"
    mine = stage.load.summaries.get(rules.level) if stage.load else None
    theirs = reference.load.summaries.get(rules.level) if reference.load else None
    now = getattr(mine, metric, None) if mine else None
    before = getattr(theirs, metric, None) if theirs else None
    if not now or not before:
        return missing(rule, metric)
    why = (f"{stage.name} was not timed in interleaved rounds against {reference.name}: the two "
           "runs were apart, so drift between them is not bounded; unpaired, ")
    ours, base = (_latency_samples(r, rules.level, metric) for r in (stage, reference))
    details: dict = {"stage_ms": now, "parent_ms": before, "paired": "no"}
    if len(ours) >= 10 and len(base) >= 10:
        q = policy.quality
        ci = stats.median_ratio_ci(ours, base, q.confidence, q.bootstrap_resamples, q.seed)
        text = (f"median {metric[:4]} {np.median(ours):.1f} ms vs {np.median(base):.1f} ms "
                f"({ci.estimate:+.1%}, request-level {q.confidence:.0%} CI [{ci.low:+.1%}, "
                f"{ci.high:+.1%}] over {len(ours)}/{len(base)} requests; limit +{limit:.0%})")
        details |= {"increase": ci.estimate, "ci_low": ci.low, "ci_high": ci.high}
        increase = ci.estimate
    else:
        increase = now / before - 1
        text = (f"{metric} {now:.1f} vs {before:.1f} ({increase:+.1%}, limit +{limit:.0%}; only "
                f"{len(ours)}/{len(base)} raw samples: point estimate)")
        details |= {"increase": increase}
    return judged(rule, "inconclusive", rules.required, why + text, value=increase, limit=limit,
                  details=details)


def _latency_samples(record: StageRecord, level: str, metric: str) -> np.ndarray:
    if record.load is None:
        return np.array([])
    name = "tpot_ms" if metric.startswith("tpot") else "ttft_ms"
    values = [getattr(s, name) for s in record.load.samples.get(level, []) if not s.error]
    return np.array([v for v in values if v is not None and v > 0], dtype=float)


def error_rate_checks(stage: StageRecord, policy: GatePolicy) -> list[Check]:
    """Per level: an exact one-sided binomial test of "error rate <= limit" at policy alpha.

    The limit is the stricter of the policy's and the load profile's. A handful of requests
    cannot show a 1 % rate exceeded by one error; a level with no request fails closed.
    """
    limits = [policy.load.max_error_rate, stage.load.max_error_rate]
    limit = min(x for x in limits if x is not None)
    alpha = policy.quality.alpha
    checks = []
    for level, summary in stage.load.summaries.items():
        rule = f"load.{level}.errors"
        if summary.requests <= 0:
            checks.append(Check(rule=rule, passed=False, value=None, limit=limit,
                                reason="no request was measured: fail closed"))
            continue
        p = float(scipy_stats.binomtest(summary.errors, summary.requests, limit,
                                        alternative="greater").pvalue)
        over = p < alpha
        checks.append(Check(
            rule=rule, passed=not over, value=summary.error_rate, limit=limit,
            details={"errors": summary.errors, "requests": summary.requests, "p_value": p,
                     "alpha": alpha},
            reason=f"{summary.errors}/{summary.requests} requests failed ({summary.error_rate:.1%}, "
            f"limit {limit:.1%}): exact binomial P(>= {summary.errors} errors | rate {limit:.1%}) "
            f"= {p:.3g} {'<' if over else '>='} alpha {alpha:g}"
            + (": above the limit beyond chance" if over else ": not shown above the limit"),
        ))
    return checks


def load_checks(
    stage: StageRecord,
    parent: StageRecord,
    baseline: StageRecord,
    policy: GatePolicy,
    records: Mapping[str, StageRecord] | None = None,
) -> list[Check]:
    """Errors per level; latency against the reference and, summed along the chain, the baseline.

    `records` (all stages by name) lets the cumulative check walk ancestors beyond the parent.
    """
    rules = policy.latency
    if stage.emulated:  # its speed is predicted for the target GPU (capacity what-if) instead
        return [Check(
            rule=f"latency.{rules.level}", passed=True, applicable=False,
            reason=f"not measured: {stage.name} serves dequantized (emulated) weights, so its "
            "speed here says nothing of the format's; see the capacity what-if (a prediction)",
        )]
    if stage.load is None or not stage.load.summaries:
        return [missing("load", "load")]
    checks = error_rate_checks(stage, policy)
    known = dict(records or {}) | {parent.name: parent, baseline.name: baseline}
    # An emulated parent's speed means nothing: the reference is the baseline, served as is.
    reference = baseline if parent.emulated else parent
    limits = {"tpot_p50_ms": rules.max_tpot_p50_increase, "ttft_p50_ms": rules.max_ttft_p50_increase}
    for metric, limit in limits.items():
        step = timed_step(stage, rules.level, metric)
        if step is None:
            checks.append(_unpaired_check(stage, reference, metric, limit, policy))
            continue
        checks.append(_step_check(stage, step, metric, limit, policy))
        cumulative = _cumulative_check(stage, known, baseline.name, metric, limit, policy)
        if cumulative is not None:
            checks.append(cumulative)
    return checks
