"""Accuracy rules: a pooled paired non-inferiority test against the baseline, and per-set harm."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from evalsets.results import QualityItem, QualityResult
from gates import stats
from gates.length import length_checks, length_ratios
from gates.noninferiority import Stratum, look_alpha, score_interval, simulated_power
from gates.policy import GatePolicy, precision_class
from gates.record import StageRecord, paired_items
from gates.verdict import Check, judged, missing, points

Pairs = list[tuple[QualityItem, QualityItem]]


def correct(item: QualityItem) -> bool:
    return item.score >= 0.5


@dataclass
class SetCounts:
    """One set (or group) of one stage, paired with the baseline and with the parent."""

    rule: str
    n: int
    baseline_correct: int
    stage_correct: int
    broke: int  # vs the baseline: right -> wrong
    fixed: int  # vs the baseline: wrong -> right
    parent_broke: int
    parent_fixed: int

    @classmethod
    def of(cls, rule: str, vs_baseline: Pairs, vs_parent: Pairs) -> SetCounts:
        return cls(
            rule=rule, n=len(vs_baseline),
            baseline_correct=sum(correct(b) for b, _ in vs_baseline),
            stage_correct=sum(correct(s) for _, s in vs_baseline),
            broke=sum(correct(b) and not correct(s) for b, s in vs_baseline),
            fixed=sum(not correct(b) and correct(s) for b, s in vs_baseline),
            parent_broke=sum(correct(p) and not correct(s) for p, s in vs_parent),
            parent_fixed=sum(not correct(p) and correct(s) for p, s in vs_parent),
        )

    @property
    def stratum(self) -> Stratum:
        return Stratum(self.n, self.broke, self.fixed)

    def bound(self, margin: float) -> str | None:
        """Why this set cannot vouch at this margin, or None.

        At the floor the baseline gets fewer items right than the margin's worth, so even losing
        every one of them is not a margin-sized drop; at the ceiling it gets fewer wrong, so the
        set cannot show the stage at its worst either way.
        """
        room = math.ceil(margin * self.n)
        if self.baseline_correct < room:
            return f"at the floor: the baseline answers {self.baseline_correct}/{self.n} right"
        if self.n - self.baseline_correct < room:
            return f"at the ceiling: the baseline answers {self.baseline_correct}/{self.n} right"
        return None

    def summary(self) -> str:
        return (f"{self.stage_correct}/{self.n} vs baseline {self.baseline_correct}/{self.n} "
                f"({self.broke} right->wrong, {self.fixed} wrong->right)")


def _interval_text(estimate: float, low: float, high: float, level: float) -> str:
    return (f"paired diff {points(estimate)} pts, one-sided {1 - level:.1%} score bounds "
            f"[{points(low)}, {points(high)}]")


def _pooled(sets: list[SetCounts], margin: float, level: float,
            ) -> tuple[list[SetCounts], tuple[float, float, float] | None, str]:
    """The sets that can vouch, their pooled (estimate, low, high) and the outcome."""
    vouching = [s for s in sets if s.bound(margin) is None]
    if not vouching:
        return vouching, None, "inconclusive"
    estimate, low, high = score_interval([s.stratum for s in vouching], level)
    outcome = "pass" if low >= -margin else "fail" if high < -margin else "inconclusive"
    return vouching, (estimate, low, high), outcome


def pooled_check(sets: list[SetCounts], margin: float, precision: str,
                 policy: GatePolicy) -> Check:
    """The required rule: equal-weight stratified non-inferiority over the sets that can vouch."""
    q = policy.quality
    level = look_alpha(q.alpha, q.max_looks)
    vouching, interval, outcome = _pooled(sets, margin, level)
    left_out = [f"{s.rule.removeprefix('quality.')} ({s.bound(margin)})"
                for s in sets if s.bound(margin)]
    note = f"; left out: {', '.join(left_out)}" if left_out else ""
    if interval is None:
        return judged("quality.accuracy", "inconclusive", True,
                      f"no eval set can vouch for accuracy at a {100 * margin:.0f}-point margin{note}",
                      details={"sets": 0, "margin": margin})
    estimate, low, high = interval
    sizes = [s.n for s in vouching]
    power = simulated_power(sizes, margin, q.planning_discordance, level, seed=q.seed, draws=4000)
    per_set = ", ".join(f"{s.rule.removeprefix('quality.')} {s.summary()}" for s in vouching)
    reason = (
        f"{_interval_text(estimate, low, high, level)} over {len(vouching)} sets "
        f"({sum(sizes)} items, equal weights; {per_set}); "
        f"margin -{100 * margin:.0f} pts ({precision}); alpha {q.alpha} split over {q.max_looks} looks; "
        f"power {power:.0%} for an equivalent stage at {q.planning_discordance:.0%} flips{note}"
    )
    if outcome == "inconclusive":
        reason += "; score more items to decide"
    return judged("quality.accuracy", outcome, True, reason, value=low, limit=-margin, details={
        "difference": estimate, "ci_low": low, "ci_high": high, "margin": margin,
        "n": sum(sizes), "sets": len(vouching), "alpha_per_look": level, "power": power,
        "looks": q.max_looks,
    })


def set_check(s: SetCounts, p_holm: float, margin: float, required: bool,
              policy: GatePolicy) -> Check:
    """Per set: fails on confident harm or significant flips vs the parent.

    A set whose own interval cannot decide is advisory, unless its estimate is already worse
    than the margin: such a set leans inferior, so it blocks (and gets more items) until its
    interval clears it. Equal weights alone would let one collapsed set of four pass within a
    pooled margin; this is what catches it without making every small set a coin toss."""
    q = policy.quality
    level = look_alpha(q.alpha, q.max_looks)
    estimate, low, high = score_interval([s.stratum], level)
    p_parent = stats.mcnemar_worse(s.parent_broke, s.parent_fixed)
    reason = (
        f"accuracy {s.summary()}: {_interval_text(estimate, low, high, level)}, margin "
        f"-{100 * margin:.0f} pts; flips vs parent {s.parent_broke} right->wrong, "
        f"{s.parent_fixed} wrong->right (McNemar p={p_parent:.3g}, Holm {p_holm:.3g})"
    )
    details = {"n": s.n, "baseline_accuracy": s.baseline_correct / s.n,
               "stage_accuracy": s.stage_correct / s.n, "difference": estimate,
               "ci_low": low, "ci_high": high, "margin": margin, "broke": s.broke,
               "fixed": s.fixed, "parent_broke": s.parent_broke, "parent_fixed": s.parent_fixed,
               "p_mcnemar": p_parent, "p_holm": p_holm}
    fields = {"value": low, "limit": -margin, "details": details}
    if p_holm < q.alpha:
        return judged(s.rule, "fail", required,
                      f"significantly more right->wrong flips (Holm p < {q.alpha}): " + reason,
                      **fields)
    if high < -margin:
        return judged(s.rule, "fail", required, "worse than the margin even at the upper bound: "
                      + reason, **fields)
    if s.bound(margin):
        return judged(s.rule, "inconclusive", False, f"{s.bound(margin)}, cannot vouch: " + reason,
                      **fields)
    if low >= -margin:
        return judged(s.rule, "pass", required, "non-inferior: " + reason, **fields)
    if leans_inferior(s, margin):
        return judged(s.rule, "inconclusive", True,
                      f"leans inferior (estimate beyond the margin, not resolved): {reason}; "
                      "score more items to decide", **fields)
    return judged(s.rule, "inconclusive", required,
                  reason + " (the pooled rule quality.accuracy decides)", **fields)


def leans_inferior(s: SetCounts, margin: float) -> bool:
    return not s.bound(margin) and (s.fixed - s.broke) / s.n < -margin


def measured_sets(stage: QualityResult, parent: QualityResult, baseline: QualityResult,
                  ) -> tuple[dict[str, tuple[Pairs, Pairs]], dict[str, str]]:
    """Per set name in any of the three: (pairs vs baseline, pairs vs parent), or why missing."""
    names = sorted(set(stage.tasks) | set(parent.tasks) | set(baseline.tasks))
    paired, problems = {}, {}
    for name in names:
        absent = [who for who, result in (("stage", stage), ("parent", parent),
                                          ("baseline", baseline)) if name not in result.tasks]
        if absent:
            problems[name] = f"set {name!r} on the {' and the '.join(absent)}"
            continue
        task = stage.tasks[name]
        paired[name] = (paired_items(baseline.tasks[name], task),
                        paired_items(parent.tasks[name], task))
    return paired, problems


def quality_checks(
    stage: StageRecord, parent: StageRecord, baseline: StageRecord, policy: GatePolicy
) -> list[Check]:
    """The pooled non-inferiority rule, then per set and per group: harm and flips."""
    q = policy.quality
    if stage.quality is None or parent.quality is None or baseline.quality is None:
        return [missing("quality", "quality")]
    precision = precision_class(stage.axes)
    margin = policy.tolerance(precision).accuracy_margin
    paired, problems = measured_sets(stage.quality, parent.quality, baseline.quality)
    checks = [missing(f"quality.{name}", problem) for name, problem in problems.items()]
    sets: list[SetCounts] = []
    groups: list[SetCounts] = []
    for name, (vs_baseline, vs_parent) in paired.items():
        rule = f"quality.{name}"
        n = min(len(vs_baseline), len(vs_parent))
        if n < q.min_items:
            checks.append(Check(
                rule=rule, passed=False, value=n, limit=q.min_items, details={"n": n},
                reason=f"only {n} paired items (< {q.min_items}): cannot decide, fail closed",
            ))
            continue
        sets.append(SetCounts.of(rule, vs_baseline, vs_parent))
        for group in sorted({b.group for b, _ in vs_baseline if b.group}, key=natural_order):
            in_group = [(b, s) for b, s in vs_baseline if b.group == group]
            ids = {b.id for b, _ in in_group}
            counts = SetCounts.of(f"{rule}.{group}", in_group,
                                  [(p, s) for p, s in vs_parent if s.id in ids])
            if counts.n < q.min_items:
                checks.append(judged(
                    counts.rule, "inconclusive", q.long_context_required,
                    f"only {counts.n} paired items in group {group!r} (< {q.min_items}): "
                    f"{counts.summary()}", value=counts.n, limit=q.min_items,
                    details={"n": counts.n, "baseline_accuracy": counts.baseline_correct / counts.n,
                             "stage_accuracy": counts.stage_correct / counts.n},
                ))
                continue
            groups.append(counts)
    if not problems and sets:
        checks.insert(0, pooled_check(sets, margin, precision, policy))
    elif not sets:
        checks.append(missing("quality.accuracy", "accuracy on any set with enough items"))
    measured = [(s, False) for s in sets] + [(g, q.long_context_required) for g in groups]
    adjusted = stats.holm({s.rule: stats.mcnemar_worse(s.parent_broke, s.parent_fixed)
                           for s, _ in measured})
    checks += [set_check(s, adjusted[s.rule], margin, required, policy) for s, required in measured]
    return checks


def natural_order(label: str) -> tuple:
    """'2k' < '16k'; 'long' and 'short' alphabetically after the numbered ones."""
    digits = "".join(ch for ch in label if ch.isdigit())
    scale = 1000 if label.lower().rstrip("s").endswith("k") else 1
    return (0, int(digits) * scale, label) if digits else (1, 0, label)


@dataclass
class PowerPlan:
    """The pooled test's power for an equivalent stage, at the sizes a spec reaches."""

    precision: str
    margin: float
    sizes: dict[str, int]  # items at the first look
    reachable: dict[str, int]  # items at the last look, within each set's pool
    power: float
    needed: dict[str, int] | None  # first-look items that would reach the policy's power

    def describe(self, target: float) -> str:
        sets = ", ".join(f"{name} {self.sizes[name]}->{self.reachable[name]}" for name in self.sizes)
        return (f"{self.precision} margin -{100 * self.margin:.0f} pts: power {self.power:.0%} "
                f"(policy {target:.0%}) with items {sets}")


def plan_power(sizes: dict[str, int], pools: dict[str, int], precision: str,
               policy: GatePolicy) -> PowerPlan:
    """Power of the pooled accuracy test at the last look, for a stage as good as the baseline
    whose items flip at the policy's planning rate; and the items that would reach the target."""
    q = policy.quality
    margin = policy.tolerance(precision).accuracy_margin
    level = look_alpha(q.alpha, q.max_looks)
    names = list(sizes)

    def power_at(first: list[int], draws: int) -> tuple[list[int], float]:
        reach = [policy.reachable(n, pools[name]) for n, name in zip(first, names, strict=True)]
        return reach, simulated_power(reach, margin, q.planning_discordance, level, seed=q.seed,
                                      draws=draws)

    reach, power = power_at([sizes[n] for n in names], 20_000)
    needed = None
    if power < q.power:
        for factor in (1.25, 1.5, 2, 3, 4, 6, 8, 12, 16):
            first = [min(pools[n], math.ceil(sizes[n] * factor)) for n in names]
            if power_at(first, 4000)[1] >= q.power:
                needed = dict(zip(names, first, strict=True))
                break
    return PowerPlan(precision=precision, margin=margin, sizes=dict(sizes),
                     reachable=dict(zip(names, reach, strict=True)), power=power, needed=needed)


def more_items(stage: QualityResult, baseline: QualityResult, precision: str,
               policy: GatePolicy, pools: dict[str, int],
               parent: QualityResult | None = None) -> dict[str, int] | None:
    """The items per set for the next look, or None when nothing is left to decide or to grow.

    Every set grows while the pooled rule is inconclusive; otherwise only the sets that cannot
    vouch yet (floor or ceiling) or lean inferior without a decision do. While the required
    length rule against the parent is inconclusive, the sets in which some answer changed length
    grow, as far as the parent's answers reach (`parent` None: the parent is the baseline, which
    is served again for them)."""
    margin = policy.tolerance(precision).accuracy_margin
    level = look_alpha(policy.quality.alpha, policy.quality.max_looks)
    paired, problems = measured_sets(stage, baseline, baseline)
    if problems or not paired:
        return None
    sets = {name: SetCounts.of(f"quality.{name}", vs_baseline, vs_parent)
            for name, (vs_baseline, vs_parent) in paired.items()}
    sizes = {name: len(stage.tasks[name].items) for name in paired}
    limits = {name: pools.get(name, n) for name, n in sizes.items()}
    if _pooled(list(sets.values()), margin, level)[2] == "inconclusive":  # no power to print
        growing = list(sets)
    else:
        growing = [name for name, counts in sets.items() if counts.bound(margin) or (
            leans_inferior(counts, margin) and score_interval([counts.stratum], level)[2] >= -margin)]
    if not growing and policy.length.required:
        growing = [name for name in _length_growth(stage, parent or baseline, policy)
                   if name in sets]
        if parent is not None:
            limits = {name: min(limits[name], len(parent.tasks[name].items))
                      for name in sizes if name in parent.tasks}
    grown = dict(sizes)
    for name in growing:
        if name in limits:
            grown[name] = max(sizes[name], min(limits[name],
                                               math.ceil(sizes[name] * policy.quality.growth)))
    return grown if any(grown[name] > sizes[name] for name in sizes) else None


def _length_growth(stage: QualityResult, parent: QualityResult, policy: GatePolicy) -> list[str]:
    """The sets to grow while the length rule is inconclusive: those in which an answer changed
    length. A set whose answers all kept their length (the demo's long-context retrievals, its
    costliest items) carries no drift to resolve: more of it would only dilute the pooled ratio
    toward x1, a pass bought by averaging in zeros."""
    def wrap(name: str, quality: QualityResult) -> StageRecord:
        return StageRecord(name=name, kind="stage", parent=None, axes={}, quality=quality)

    stage_record, parent_record = wrap("stage", stage), wrap("parent", parent)
    if length_checks(stage_record, parent_record, policy)[0].status != "inconclusive":
        return []
    return [name for name, ratios in length_ratios(stage_record, parent_record).items()
            if np.count_nonzero(ratios)]
