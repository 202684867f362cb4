"""Accuracy rules: pooled and per-set paired non-inferiority against the baseline, per group.

The go needs every one of these (an intersection-union test: each at the look's level, so the
chance of a false go stays within alpha however many there are):

- the pooled rule over the sets that can vouch, at the precision class's margin;
- every set on its own, at the set margin (a multiple of the pooled one: a set's own items can
  resolve only a larger loss), capped where the set sits on the error scale: near the ceiling
  the stage may make at most `max_error_ratio` times the baseline's errors (95 % -> 85 % is 3x
  the errors, though only 10 points), never below the pooled margin; near the floor it must
  keep 1/`max_error_ratio` of the right answers (`SetMargin`: judged against the baseline's
  true rates by ratio score tests, not the sample's). A set at the floor, whose baseline has
  too few right answers for losing them all to show a margin-sized drop, cannot vouch in the
  pool and is judged on that ratio alone (`floor_judge`): it fails once it confidently keeps
  less, and blocks while unresolved where an equivalent stage would resolve by its reach;
  a few right answers that flip at random (a guess's) are shown unless confidently lost;
- every group of a set (the long-context length buckets) at the group margin, capped by the
  ratio like a set where its baseline may sit near the ceiling or the floor (`group_rule`), when
  the stage serves a quantized KV cache (long context is where KV error shows) or the policy asks
  for groups always; otherwise a group only fails on confident harm.

A set's groups are strata of its interval; declared clusters widen every interval by their
design effect (gates.noninferiority). A rule that its items cannot resolve is inconclusive and
blocks, and the adaptive sample size grows the sets concerned while looks are left: by `growth`,
or at once to the size at which the set's observed discordance and design effect say an
equivalent set resolves (a blinded re-estimate), within the set's pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import binomtest, norm

from evalsets.results import QualityItem, QualityResult
from evalsets.sampling import sub_items
from gates import stats
from gates.length import length_checks, length_ratios, over_censored
from gates.noninferiority import (
    Stratum,
    design_effect,
    look_alpha,
    ratio_z,
    score_interval,
    simulated_power,
)
from gates.policy import GatePolicy, precision_class
from gates.record import StageRecord, paired_items
from gates.verdict import Check, judged, missing, points

Pairs = list[tuple[QualityItem, QualityItem]]
# An unresolved set grows to the items at which an equivalent set resolves this often.
RESOLVE_POWER = 0.95


def correct(item: QualityItem) -> bool:
    return item.score >= 0.5


def serves_quantized_kv(axes: dict[str, str] | None) -> bool:
    """The stage's KV cache is quantized (any dtype but the model's own)."""
    return (axes or {}).get("kv_cache", "auto") not in ("auto", "none", "")


def by_sample(pairs: Pairs) -> Pairs:
    """Sampled items as their samples, sample j against sample j (the same seed on both sides),
    the k samples of an item one cluster (evalsets.sampling); other pairs as they are."""
    if not any(first.samples or second.samples for first, second in pairs):
        return list(pairs)
    out: Pairs = []
    for first, second in pairs:
        mine, theirs = sub_items(first), sub_items(second)
        out += list(zip(mine, theirs, strict=True)) if len(mine) == len(theirs) else [(first, second)]
    return out


def samples_per_item(pairs: Pairs) -> int:
    return max((len(first.samples or ()) for first, _ in pairs), default=0) or 1


def _differences(pairs: Pairs) -> list[int]:
    return [int(correct(s)) - int(correct(b)) for b, s in pairs]


def set_design_effect(pairs: Pairs) -> float:
    """The set's design effect from its declared clusters (1 when none are declared)."""
    clusters = [b.cluster if b.cluster is not None else f"item:{b.id}" for b, _ in pairs]
    return design_effect(_differences(pairs), clusters)


def _strata(pairs: Pairs, deff: float) -> list[Stratum]:
    """One stratum per group (one for an ungrouped set), weighted by its share of the items."""
    by_group: dict[str, Pairs] = {}
    for pair in pairs:
        by_group.setdefault(pair[0].group or "", []).append(pair)
    out = []
    for members in by_group.values():
        diffs = _differences(members)
        out.append(Stratum(len(members), sum(d < 0 for d in diffs), sum(d > 0 for d in diffs),
                           weight=len(members) / len(pairs), design_effect=deff))
    return out


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
    strata: list[Stratum] = field(default_factory=list)
    samples: int = 1  # per item, in a sampled set: `n` counts samples, `items` the items

    @classmethod
    def of(cls, rule: str, vs_baseline: Pairs, vs_parent: Pairs,
           deff: float | None = None) -> SetCounts:
        samples = samples_per_item(vs_baseline)
        vs_baseline, vs_parent = by_sample(vs_baseline), by_sample(vs_parent)
        deff = set_design_effect(vs_baseline) if deff is None else deff
        both = [(correct(b), correct(s)) for b, s in vs_baseline]
        parent = [(correct(p), correct(s)) for p, s in vs_parent]
        return cls(
            rule=rule, n=len(vs_baseline),
            baseline_correct=sum(b for b, _ in both),
            stage_correct=sum(s for _, s in both),
            broke=sum(b and not s for b, s in both),
            fixed=sum(s and not b for b, s in both),
            parent_broke=sum(p and not s for p, s in parent),
            parent_fixed=sum(s and not p for p, s in parent),
            strata=_strata(vs_baseline, deff),
            samples=samples,
        )

    @property
    def items(self) -> int:
        return self.n // self.samples

    @property
    def design_effect(self) -> float:
        return self.strata[0].design_effect if self.strata else 1.0

    def ratio_z(self, ratio: float) -> tuple[float, float]:
        """Score statistics (negative: holds) of the two error-scale limits, against the
        baseline's true rates: the stage makes under `ratio` times the baseline's errors (the
        ceiling), and keeps over 1/`ratio` of its right answers (the floor)."""
        both_wrong = self.n - self.baseline_correct - self.fixed
        both_right = self.baseline_correct - self.broke
        return (ratio_z(self.n, both_wrong, self.fixed, self.broke, ratio, self.design_effect),
                ratio_z(self.n, both_right, self.fixed, self.broke, ratio, self.design_effect))

    def needed(self, margin: float, level: float, power: float) -> int:
        """Items at which a set as good as the baseline would resolve at `margin` with `power`:
        the normal-approximation size from its observed discordance and design effect (the
        blinded re-estimate: the difference itself is not used, so growing to it cannot favour
        a go)."""
        discordance = (self.broke + self.fixed + 1) / (self.n + 2)
        z = float(norm.ppf(1 - level) + norm.ppf(power))
        return math.ceil(self.design_effect * discordance * (z / margin) ** 2 / self.samples)

    def bound(self, margin: float) -> str | None:
        """Why this set cannot vouch at this margin, or None.

        At the floor the baseline gets fewer items right than the margin's worth, so even losing
        every one of them is not a margin-sized drop. A set near the ceiling can still lose
        points (and its few flips resolve fast): it vouches like any other."""
        if self.baseline_correct < math.ceil(margin * self.n):
            return f"at the floor: the baseline answers {self.baseline_correct}/{self.n} right"
        return None

    def at_floor(self, margin: float, level: float, ratio: float) -> bool:
        """Losing every right answer could not be shown to lose `margin` (the drop's bound at
        `level` stays within it): the margin cannot judge this set, the ratio of its right
        answers does (`floor_judge`). A set that cannot vouch is at the floor, and so is one
        right on exactly the margin's worth (24 of 300 at 8 points); one whose ratio would
        allow more than `margin` (a 30-item bucket at 30 %: 18 points) is not: too few items
        make it look so, and the margin judges it."""
        if self.bound(margin):
            return True
        lost = Stratum(self.n, self.baseline_correct, 0, design_effect=self.design_effect)
        allows = (1 - 1 / ratio) * self.baseline_correct / self.n
        return allows <= margin and score_interval([lost], level)[2] >= -margin

    def summary(self) -> str:
        clustered = (f"; clusters: design effect {self.design_effect:.2f}"
                     if self.design_effect > 1 else "")
        if self.samples > 1:
            clustered = (f"; {self.samples} samples of each of {self.items} items"
                         f"{clustered.replace('; clusters', ', items as clusters')}")
        return (f"{self.stage_correct}/{self.n} vs baseline {self.baseline_correct}/{self.n} "
                f"({self.broke} right->wrong, {self.fixed} wrong->right{clustered})")


def own_margin(counts: SetCounts, margin: float, factor: float, policy: GatePolicy,
               reach: int | None = None) -> float:
    """The margin a set or group is held to on its own: the loss the items it can reach by the
    last look (`reach`) or has, whichever is more, resolve, z x sqrt(planning discordance / n)
    (n: effective pairs), within [margin, factor x margin]. A small set keeps its factor (code's 80
    items cannot tell -8 from 0 points); a large one is held to the pooled margin (an equivalent
    one still passes: the margin shrinks with the interval); a 250-item bucket of a 1,000-item
    set is held to 14 points, not 20. One margin at every look (read from the reach, never from
    the answers): an early look's few items do not judge a bucket at a wider one, and a set
    that a re-estimated jump took past its reach is held to what its items resolve."""
    q = policy.quality
    n = max(1, effective_pairs(max(reach or 0, counts.items), counts.samples))
    resolves = q.size_margin_z * math.sqrt(q.planning_discordance / n)
    return min(factor * margin, max(margin, resolves))


def reach_of(first: dict[str, int], pools: dict[str, int],
             group_pools: dict[str, dict[str, int]], policy: GatePolicy) -> dict[str, int]:
    """`QualityResult.reach`: each set's first look grown by the policy's looks within its pool,
    and each group's items in the set's data (an open group grows to all of them at the last
    look). The flow records it and the simulation draws it alike, so validate's power and the
    benchmark judge what a run judges."""
    reach = {name: policy.reachable(n, pools.get(name, n)) for name, n in first.items()}
    return reach | {f"{name}.{group}": n for name, counts in group_pools.items()
                    for group, n in counts.items()}


def _interval_text(estimate: float, low: float, high: float, level: float) -> str:
    return (f"paired diff {points(estimate)} pts, one-sided {1 - level:.1%} score bounds "
            f"[{points(low)}, {points(high)}]")


def _outcome(low: float, high: float, margin: float) -> str:
    return "pass" if low >= -margin else "fail" if high < -margin else "inconclusive"


@dataclass
class SetMargin:
    """A set's margin on the scale that resolves where the set sits (gates/policy.yaml):
    `margin` points, but where the baseline is near the ceiling (or the floor) no more than
    `ratio` times its errors (1/`ratio` of its right answers), and never less than `floor`.

    The limit depends on the baseline's TRUE error rate, which a sample of a few errors reads
    poorly (at 95 % and 80 items 4 errors are expected, and one sample in five has 6 or more,
    which read as a 12-point margin where the policy means 8). So the rule is not judged at the
    margin the sample's accuracy implies: the stage passes when it is non-inferior at `floor`,
    or at `margin` while paired score tests on the ratio of error rates (and of right-answer
    rates) say the stage stays within `ratio` of the baseline's; it fails when it is worse than
    `floor` and either worse than `margin` or beyond the ratio. Without `ratio` (a group away
    from the ceiling and the floor) it is `margin` alone."""

    margin: float
    floor: float | None = None
    ratio: float | None = None

    @property
    def least(self) -> float:
        """The narrowest margin the rule may hold the set to (what a set must be able to lose
        to vouch at all)."""
        return self.margin if self.floor is None else min(self.margin, self.floor)

    def judge(self, s: SetCounts, level: float) -> Judged:
        estimate, low, high = score_interval(s.strata, level)
        if self.ratio is None or self.floor is None or self.floor >= self.margin:
            return Judged(_outcome(low, high, self.margin), estimate, low, high, self.margin,
                          f"-{100 * self.margin:.0f} pts")
        z = float(norm.ppf(1 - level))
        ceiling, floor = s.ratio_z(self.ratio)
        within, beyond = max(ceiling, floor) <= -z, max(ceiling, floor) >= z
        # The margin that holds: the wide one only where the ratio tests show the stage within
        # (or where even it is broken), else the floor.
        margin = self.margin if within or high < -self.margin else self.floor
        outcome = _outcome(low, high, margin)
        if outcome == "fail" and not beyond and high >= -self.margin:
            outcome = "inconclusive"  # worse than the floor, but maybe within the ratio
        read = (f"-{100 * self.floor:.0f} pts, or -{100 * self.margin:.0f} pts within "
                f"{self.ratio:g}x the baseline's errors and 1/{self.ratio:g} of its right answers "
                f"(ratio score z {ceiling:+.2f} on errors, {floor:+.2f} on right answers: "
                f"{'within' if within else 'beyond' if beyond else 'unresolved'})")
        return Judged(outcome, estimate, low, high, margin, read)


@dataclass
class Judged:
    """A set rule's outcome, its interval and the margin it held (or broke)."""

    outcome: str
    estimate: float
    low: float
    high: float
    margin: float
    read: str
    resolves: bool = True  # an equivalent stage would resolve the rule by the set's reach


def _at_reach(s: SetCounts, reach: int | None) -> tuple[int, float, float]:
    """Pairs, baseline right answers and flips each way (blinded: half their sum; a floor set's
    few right answers may all be others', a guess's) scaled to the set's reach."""
    n = max(s.n, (reach or 0) * s.samples)
    right = s.baseline_correct * n / s.n
    return n, right, min(right, (s.broke + s.fixed + 1) / (s.n + 2) * n / 2)


def floor_resolves(s: SetCounts, policy: GatePolicy, reach: int | None, z: float) -> bool:
    """An equivalent stage would show its ratio of right answers within at `z` by the reach."""
    n, right, half = _at_reach(s, reach)
    return right >= 1 and ratio_z(n, round(right - half), round(half), round(half),
                                  policy.quality.max_error_ratio, s.design_effect) <= -z


def floor_shows_loss(s: SetCounts, policy: GatePolicy, reach: int | None, z: float) -> bool:
    """Losing every right answer would be shown beyond the ratio at `z` by the reach."""
    n, right, _ = _at_reach(s, reach)
    return right >= 1 and ratio_z(n, 0, 0, round(right), policy.quality.max_error_ratio,
                                  s.design_effect) >= z


FLOOR_POWER_Z = float(norm.ppf(RESOLVE_POWER))
READS = {"pass": "within", "fail": "beyond", "inconclusive": "unresolved"}


def floor_judge(s: SetCounts, policy: GatePolicy, reach: int | None = None) -> Judged | None:
    """A set (or group) at the floor, where losing every right answer is no margin-sized drop,
    judged on the scale that still resolves there: the stage keeps over 1/`max_error_ratio` of the
    baseline's right answers (the paired ratio score test on right answers, against the
    baseline's true rate), or it fails once it confidently keeps less. Where an equivalent stage
    would not show that by the set's reach (a few right answers that flip at random, a guess's),
    it is `resolves=False`: it fails on a confident loss, and is shown otherwise. None where the
    baseline has no right answer: nothing can be lost."""
    q = policy.quality
    level = look_alpha(q.alpha, q.max_looks)
    z = float(norm.ppf(1 - level))
    if s.baseline_correct == 0:
        return None
    kept = s.ratio_z(q.max_error_ratio)[1]
    outcome = "pass" if kept <= -z else "fail" if kept >= z else "inconclusive"
    estimate, low, high = score_interval(s.strata, level)
    share = 1 / q.max_error_ratio
    read = (f"at the floor ({s.baseline_correct}/{s.n} right: losing them all would not show "
            f"the margin): keep 1/{q.max_error_ratio:g} of its right answers (ratio score z "
            f"{kept:+.2f}: {READS[outcome]})")
    return Judged(outcome, estimate, low, high, (1 - share) * s.baseline_correct / s.n, read,
                  floor_resolves(s, policy, reach, z + FLOOR_POWER_Z))


def set_rule(counts: SetCounts, margin: float, policy: GatePolicy,
             reach: int | None = None) -> SetMargin:
    """A set's rule: its own margin (`set_margin_factor`), capped by the ratio where it sits."""
    q = policy.quality
    return SetMargin(own_margin(counts, margin, q.set_margin_factor, policy, reach), margin,
                     q.max_error_ratio)


def group_rule(counts: SetCounts, margin: float, policy: GatePolicy,
               reach: int | None = None) -> SetMargin:
    """A group's rule: its own margin (`group_margin_factor`), on the ratio scale where the
    baseline may sit near the ceiling or the floor (a bucket at 95 %: a 20-point loss is 5x its
    errors). There, as a set is, it holds the wide margin only where the ratio tests show the
    group within `max_error_ratio`, else the margin a set would get. "May sit": the margin is
    wider than the ratio allows at the bound of the baseline's accuracy (Wilson, at the policy's
    confidence). A group whose items cannot resolve a set's margin even with no flip at all
    (context_ruler's 20-item buckets) keeps its own."""
    q = policy.quality
    at = own_margin(counts, margin, q.group_margin_factor, policy, reach)
    floor = own_margin(counts, margin, q.set_margin_factor, policy, reach)
    accuracy = binomtest(counts.baseline_correct, counts.n).proportion_ci(q.confidence, "wilson")
    allows = min((q.max_error_ratio - 1) * (1 - accuracy.high),
                 (1 - 1 / q.max_error_ratio) * accuracy.low)
    n = max(reach or 0, counts.items)
    level = look_alpha(q.alpha, q.max_looks)
    if floor >= at or at <= allows or score_interval([Stratum(n, 0, 0)], level)[1] < -floor:
        return SetMargin(at)
    return SetMargin(at, floor, q.max_error_ratio)


def _pooled(sets: list[SetCounts], margin: float, level: float, floor_judged: bool = False,
            ) -> tuple[list[SetCounts], tuple[float, float, float] | None, str]:
    """The sets that can vouch, their pooled (estimate, low, high) and the outcome. Where none
    can, every set is at the floor: `floor_judged` (some of them are judged on their ratio of
    right answers, each a required rule of its own) leaves nothing to pool, else nothing can be
    judged at all."""
    vouching = [s for s in sets if s.bound(margin) is None]
    if not vouching:
        return vouching, None, "pass" if floor_judged else "inconclusive"
    estimate, low, high = score_interval([st for s in vouching for st in s.strata], level)
    return vouching, (estimate, low, high), _outcome(low, high, margin)


def floor_judged(sets: list[SetCounts], margin: float, policy: GatePolicy,
                 reach: dict[str, int]) -> bool:
    """Some set that cannot vouch at `margin` is judged on its ratio of right answers
    (`floor_judge`); only those are asked, as only they count when none vouches."""
    judged_at = [floor_judge(s, policy, reach.get(s.rule.removeprefix("quality.")))
                 for s in sets if s.bound(margin)]
    return any(j is not None and j.resolves for j in judged_at)


def pooled_check(sets: list[SetCounts], margin: float, precision: str,
                 policy: GatePolicy, reach: dict[str, int] | None = None) -> Check:
    """The required rule: equal-weight stratified non-inferiority over the sets that can vouch."""
    q = policy.quality
    level = look_alpha(q.alpha, q.max_looks)
    vouching, interval, outcome = _pooled(sets, margin, level,
                                          floor_judged(sets, margin, policy, reach or {}))
    left_out = [f"{s.rule.removeprefix('quality.')} ({s.bound(margin)})"
                for s in sets if s.bound(margin)]
    note = f"; left out: {', '.join(left_out)}" if left_out else ""
    if interval is None and outcome == "pass":
        return judged("quality.accuracy", "pass", True,
                      f"every set is at the floor of a {100 * margin:.0f}-point margin: each is "
                      f"judged on the ratio of its right answers instead{note}",
                      details={"sets": 0, "margin": margin})
    if interval is None:
        return judged("quality.accuracy", "inconclusive", True,
                      f"no eval set can vouch for accuracy at a {100 * margin:.0f}-point margin{note}",
                      details={"sets": 0, "margin": margin})
    estimate, low, high = interval
    sizes = [s.items for s in vouching]
    power = simulated_power(sizes, margin, q.planning_discordance, level, seed=q.seed, draws=4000)
    per_set = ", ".join(f"{s.rule.removeprefix('quality.')} {s.summary()}" for s in vouching)
    reason = (
        f"{_interval_text(estimate, low, high, level)} over {len(vouching)} sets "
        f"({sum(sizes)} items, equal weights, groups as strata; {per_set}); "
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


def set_check(s: SetCounts, rule: SetMargin, required: bool, policy: GatePolicy,
              what: str = "set", reach: int | None = None) -> Check:
    """One set (or group) non-inferior at its own margin; unresolved blocks when required.

    Flips against the parent (exact one-sided McNemar) are shown: they say which step broke
    what, while the decision is the non-inferiority against the baseline."""
    q = policy.quality
    level = look_alpha(q.alpha, q.max_looks)
    at_floor = s.at_floor(rule.least, level, q.max_error_ratio)
    floor = floor_judge(s, policy, reach) if at_floor else None
    judged_at = floor or rule.judge(s, level)
    estimate, low, high, margin = (judged_at.estimate, judged_at.low, judged_at.high,
                                   judged_at.margin)
    outcome = judged_at.outcome
    p_parent = stats.mcnemar_worse(s.parent_broke, s.parent_fixed)
    reason = (
        f"accuracy {s.summary()}: {_interval_text(estimate, low, high, level)}, {what} margin "
        f"{judged_at.read}; flips vs parent {s.parent_broke} right->wrong, "
        f"{s.parent_fixed} wrong->right (McNemar p={p_parent:.3g})"
    )
    details = {"n": s.n, "baseline_accuracy": s.baseline_correct / s.n,
               "stage_accuracy": s.stage_correct / s.n, "difference": estimate,
               "ci_low": low, "ci_high": high, "margin": margin, "broke": s.broke,
               "fixed": s.fixed, "parent_broke": s.parent_broke, "parent_fixed": s.parent_fixed,
               "p_mcnemar": p_parent, "design_effect": s.design_effect}
    if s.samples > 1:
        details["samples"] = s.samples
    fields = {"value": low, "limit": -margin, "details": details}
    if outcome == "fail":
        why = (f"keeps under 1/{q.max_error_ratio:g} of the baseline's right answers even at the "
               "bound: " if floor else "worse than the margin even at the upper bound: ")
        return judged(s.rule, "fail", True, why + reason, **fields)
    if at_floor and (floor is None or (outcome != "pass" and not floor.resolves)):
        # Too little to judge: shown, not a pass it did not earn, nor a block it cannot lift.
        return judged(s.rule, "inconclusive", False,
                      f"at the floor: the baseline answers {s.baseline_correct}/{s.n} right, too "
                      "few to resolve their ratio (it fails only on a confident loss): " + reason,
                      **fields)
    if outcome == "pass":
        return judged(s.rule, "pass", required, "non-inferior: " + reason, **fields)
    return judged(s.rule, "inconclusive", required,
                  f"not resolved at the {what} margin: {reason}; score more items to decide",
                  **fields)


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


def _group_pairs(vs_baseline: Pairs, vs_parent: Pairs) -> dict[str, tuple[Pairs, Pairs]]:
    out: dict[str, tuple[Pairs, Pairs]] = {}
    for group in sorted({b.group for b, _ in vs_baseline if b.group}, key=natural_order):
        in_group = [(b, s) for b, s in vs_baseline if b.group == group]
        ids = {b.id for b, _ in in_group}
        out[group] = (in_group, [(p, s) for p, s in vs_parent if s.id in ids])
    return out


def groups_required(axes: dict[str, str] | None, policy: GatePolicy) -> bool:
    return policy.quality.long_context_required or serves_quantized_kv(axes)


def quality_checks(
    stage: StageRecord, parent: StageRecord, baseline: StageRecord, policy: GatePolicy
) -> list[Check]:
    """The accuracy rules, group-sequentially: each rule is judged at every look on the items
    that look had (`QualityResult.look_sizes`), and the first look that decides it (pass or
    fail on its interval) is its verdict; a rule no look decided takes the last look's. With
    the level split over the planned looks, a false pass at any look stays within alpha, and a
    rule that passed is not undone by the items later scored for another."""
    final = checks_at_look(stage, parent, baseline, policy)
    earlier = stage.quality.look_sizes if stage.quality is not None else []
    decided: dict[str, Check] = {}
    for look, sizes in enumerate(earlier, start=1):
        for check in checks_at_look(at_sizes(stage, sizes), parent, baseline, policy):
            # A look at which some set was too small to take part decides nothing pooled.
            if (check.rule not in decided and check.status in ("pass", "fail")
                    and "ci_low" in check.details and not check.details.get("sets_too_small")):
                items = check.details.get("n")
                check.reason = f"decided at look {look} ({items} items): {check.reason}"
                decided[check.rule] = check
    return [decided.get(check.rule, check) for check in final]


def at_sizes(stage: StageRecord, sizes: dict[str, int]) -> StageRecord:
    """The stage as a look saw it: the first items of each set."""
    quality = stage.quality
    tasks = {name: task.model_copy(update={"items": task.items[:sizes.get(name, len(task.items))]})
             for name, task in quality.tasks.items()}
    return stage.model_copy(update={"quality": quality.model_copy(update={"tasks": tasks})})


def checks_at_look(
    stage: StageRecord, parent: StageRecord, baseline: StageRecord, policy: GatePolicy
) -> list[Check]:
    """The pooled non-inferiority rule, then every set and (for KV stages) every group."""
    q = policy.quality
    if stage.quality is None or parent.quality is None or baseline.quality is None:
        return [missing("quality", "quality")]
    precision = precision_class(stage.axes)
    margin = policy.tolerance(precision).accuracy_margin
    per_group = groups_required(stage.axes, policy)
    paired, problems = measured_sets(stage.quality, parent.quality, baseline.quality)
    reach = stage.quality.reach
    checks = [missing(f"quality.{name}", problem) for name, problem in problems.items()]
    sets: list[SetCounts] = []
    group_checks: list[Check] = []
    for name, (vs_baseline, vs_parent) in paired.items():
        rule = f"quality.{name}"
        n = min(len(vs_baseline), len(vs_parent))
        if n < q.min_items:
            checks.append(Check(
                rule=rule, passed=False, value=n, limit=q.min_items, details={"n": n},
                reason=f"only {n} paired items (< {q.min_items}): cannot decide, fail closed",
            ))
            continue
        counts = SetCounts.of(rule, vs_baseline, vs_parent)
        sets.append(counts)
        for group, (in_group, of_parent) in _group_pairs(vs_baseline, vs_parent).items():
            g = SetCounts.of(f"{rule}.{group}", in_group, of_parent, deff=counts.design_effect)
            if g.items < q.min_items:
                group_checks.append(judged(
                    g.rule, "inconclusive", per_group,
                    f"only {g.items} paired items in group {group!r} (< {q.min_items}): "
                    f"{g.summary()}", value=g.n, limit=q.min_items,
                    details={"n": g.n, "baseline_accuracy": g.baseline_correct / g.n,
                             "stage_accuracy": g.stage_correct / g.n}))
                continue
            at = reach.get(f"{name}.{group}")
            group_checks.append(set_check(g, group_rule(g, margin, policy, at), per_group, policy,
                                          "group", at))
    if not problems and sets:
        pooled = pooled_check(sets, margin, precision, policy, reach)
        pooled.details["sets_too_small"] = len(paired) - len(sets)
        checks.insert(0, pooled)
    elif not sets:
        checks.append(missing("quality.accuracy", "accuracy on any set with enough items"))
    for s in sets:
        at = reach.get(s.rule.removeprefix("quality."))
        checks.append(set_check(s, set_rule(s, margin, policy, at), True, policy, reach=at))
    return checks + group_checks


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


# Planning: the k samples of an item share their draws this often (gates.simulate's sample_rho).
SAMPLE_RHO = 0.5


def effective_pairs(items: int, samples: int) -> int:
    """Independent pairs that `items` items of `samples` samples each are worth, at SAMPLE_RHO:
    k samples count as k / (1 + (k - 1) rho) items (4 samples: 1.6 items), never as k."""
    return math.floor(items * samples / (1 + (samples - 1) * SAMPLE_RHO))


def plan_power(sizes: dict[str, int], pools: dict[str, int], precision: str,
               policy: GatePolicy, samples: dict[str, int] | None = None) -> PowerPlan:
    """Power of the pooled accuracy test at the last look, for a stage as good as the baseline
    whose items flip at the policy's planning rate; and the items that would reach the target.
    `samples`: per sampled set, its samples per item (evalsets.sampling)."""
    q = policy.quality
    margin = policy.tolerance(precision).accuracy_margin
    level = look_alpha(q.alpha, q.max_looks)
    names = list(sizes)
    per_item = {name: (samples or {}).get(name, 1) for name in names}

    def power_at(first: list[int], draws: int) -> tuple[list[int], float]:
        reach = [policy.reachable(n, pools[name]) for n, name in zip(first, names, strict=True)]
        pairs = [effective_pairs(n, per_item[name]) for n, name in zip(reach, names, strict=True)]
        return reach, simulated_power(pairs, margin, q.planning_discordance, level, seed=q.seed,
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


@dataclass
class Look:
    """The next look: items per set, and per set that grows the open rules it grows for.

    `sizes` are the first items of each set's pool (a prefix). A set whose only open rules are
    groups of it grows by group (`groups`: each such group's items in all, the first of that
    group's own items), so an unresolved 4k bucket costs 4k items only; its `sizes` entry is then
    the prefix that would hold as many of that group (what a reader that grows sets by prefix
    alone, `more_items`, asks)."""

    sizes: dict[str, int]
    reasons: dict[str, list[str]] = field(default_factory=dict)
    groups: dict[str, dict[str, int]] = field(default_factory=dict)

    def line(self) -> str:
        """'math 240 items (quality.accuracy, length.math), ...': each growing set with its rules."""
        def grows(name: str) -> str:
            if name in self.groups:
                return ", ".join(f"{name} {group} {n} items"
                                 for group, n in self.groups[name].items())
            return f"{name} {self.sizes[name]} items"

        return ", ".join(grows(name) + (f" ({', '.join(self.reasons[name])})"
                                        if self.reasons.get(name) else "")
                         for name in self.reasons)


def group_counts(task_items: list[QualityItem]) -> dict[str, int]:
    """Items per group, in the order the groups first appear."""
    counts: dict[str, int] = {}
    for item in task_items:
        if item.group:
            counts[item.group] = counts.get(item.group, 0) + 1
    return counts


def more_items(stage: QualityResult, baseline: QualityResult, precision: str,
               policy: GatePolicy, pools: dict[str, int],
               parent: QualityResult | None = None,
               axes: dict[str, str] | None = None,
               parent_served: bool = False,
               group_pools: dict[str, dict[str, int]] | None = None) -> dict[str, int] | None:
    """The items per set for the next look, or None when nothing is left to decide or to grow
    (`next_look`'s sizes: every set grown by prefix, a set growing by group to the prefix that
    holds its groups' items)."""
    look = next_look(stage, baseline, precision, policy, pools, parent, axes, parent_served,
                     group_pools)
    return look.sizes if look is not None else None


def next_look(stage: QualityResult, baseline: QualityResult, precision: str,
              policy: GatePolicy, pools: dict[str, int],
              parent: QualityResult | None = None,
              axes: dict[str, str] | None = None,
              parent_served: bool = False,
              group_pools: dict[str, dict[str, int]] | None = None) -> Look | None:
    """The next look, or None when nothing is left to decide or to grow.

    Every set grows while the pooled rule is inconclusive; otherwise the sets whose own rule is
    unresolved at the set margin grow. For a stage judged per group (`axes` serve a quantized KV
    cache), a set whose own rule is resolved but some of whose groups are unresolved or too small
    grows those groups alone (`Look.groups`): each by `growth` or to the items at which it would
    resolve, and at the last look to every item its group has (`group_pools`: per set, items per
    group; without it, the set's pool in the groups' shares so far), since no later look can
    resolve it. While the required length rule against the parent is inconclusive, the sets in
    which some answer changed length grow, as far as the parent's answers reach, or within the
    pool where the parent is served again for them (`parent_served`; `parent` None: the parent
    is the baseline, always served again)."""
    q = policy.quality
    margin = policy.tolerance(precision).accuracy_margin
    level = look_alpha(q.alpha, q.max_looks)
    paired, problems = measured_sets(stage, baseline, baseline)
    if problems or not paired:
        return None
    sets = {name: SetCounts.of(f"quality.{name}", vs_baseline, vs_parent)
            for name, (vs_baseline, vs_parent) in paired.items()}
    sizes = {name: len(stage.tasks[name].items) for name in paired}
    have = {name: group_counts(stage.tasks[name].items) for name in paired}
    limits = {name: pools.get(name, n) for name, n in sizes.items()}
    per_group = groups_required(axes, policy)

    def unresolved(counts: SetCounts, key: str, group: bool = False) -> int:
        """0 when the rule is resolved (or cannot be: at the floor), else the set's items at
        which it would resolve."""
        if counts.items < q.min_items:
            return q.min_items
        reach = stage.reach.get(key)
        rule = (group_rule if group else set_rule)(counts, margin, policy, reach)
        if counts.at_floor(rule.least, level, q.max_error_ratio):
            floor = floor_judge(counts, policy, reach)
            kept = counts.ratio_z(q.max_error_ratio)[1]
            # One that cannot resolve an equivalent stage grows while it leans beyond the ratio
            # or its reach could show a loss (the few right answers of a guess, kept, ask for
            # nothing). Planned on the test's statistic, which grows as the root of the items.
            if floor is None or floor.outcome != "inconclusive" or not (
                    floor.resolves or kept >= 0 or floor_shows_loss(
                        counts, policy, reach, float(norm.ppf(1 - level)))):
                return 0
            wanted = float(norm.ppf(1 - level) + norm.ppf(RESOLVE_POWER))
            return (max(1, math.ceil(counts.items * (wanted / kept) ** 2)) if kept < 0
                    else reach or pools.get(key, counts.items))
        judged_now = rule.judge(counts, level)
        if judged_now.outcome != "inconclusive":
            return 0
        # Planned at the margin that holds now: the floor until the ratio tests show the stage
        # within (a set near the ceiling then grows for the test that can decide it).
        return max(1, counts.needed(judged_now.margin, level, RESOLVE_POWER))

    last = stage.looks + 1 >= q.max_looks  # the look planned now is the last one

    def group_unresolved(name: str) -> dict[str, int]:
        """Each unresolved group's items at which it would resolve."""
        vs_baseline, vs_parent = paired[name]
        deff = sets[name].design_effect
        wanted = {group: unresolved(SetCounts.of(name, g_base, g_parent, deff),
                                    f"{name}.{group}", group=True)
                  for group, (g_base, g_parent) in _group_pairs(vs_baseline, vs_parent).items()}
        return {group: need for group, need in wanted.items() if need}

    def group_targets(name: str) -> dict[str, int]:
        """Each unresolved group's items after the look, within what its group has."""
        counts, n = have[name], sizes[name]
        has = (group_pools or {}).get(name) or {
            group: limits[name] * count // max(1, n) for group, count in counts.items()}
        out = {}
        for group, need in open_groups[name].items():
            now = counts.get(group, 0)
            room = has.get(group, now)
            out[group] = room if last else min(room, max(math.ceil(now * q.growth), need))
        return {group: wanted for group, wanted in out.items() if wanted > counts.get(group, 0)}

    reasons: dict[str, list[str]] = {name: [] for name in sets}
    needs: dict[str, int] = {}
    open_groups: dict[str, dict[str, int]] = {}
    own_open: set[str] = set()
    for name, counts in sets.items():
        own = unresolved(counts, name)
        groups = group_unresolved(name) if per_group else {}
        open_groups[name] = groups
        if own:
            own_open.add(name)
        needs[name] = max([own, *(need * counts.items // max(1, have[name].get(group, 0))
                                  for group, need in groups.items())])
        reasons[name] += ([f"quality.{name}"] if own else []) + [
            f"quality.{name}.{group}" for group in sorted(groups, key=natural_order)]
    pooled_open = _pooled(list(sets.values()), margin, level,
                          floor_judged(list(sets.values()), margin, policy,
                                       stage.reach))[2] == "inconclusive"
    if pooled_open:
        for name in sets:
            reasons[name].insert(0, "quality.accuracy")
    growing = set(sets) if pooled_open else {name for name, need in needs.items() if need}
    grown, by_group = dict(sizes), {}
    for name in growing:
        if not pooled_open and name not in own_open:
            # Only groups open: those groups grow alone; the prefix that would hold as many of
            # each is what a reader growing whole sets asks (`more_items`).
            targets = group_targets(name)
            if not targets:  # every open group has all its items already
                continue
            by_group[name] = targets
            step = max(math.ceil(sizes[name] * q.growth),
                       *(math.ceil(want * sizes[name] / max(1, have[name].get(group, 1)))
                         for group, want in targets.items()))
            grown[name] = max(sizes[name], min(limits[name], step))
            continue
        # A batch multiplies the set by `growth`, or jumps to the size at which its own rule
        # would resolve (re-estimated from its discordance), within its pool.
        step = max(math.ceil(sizes[name] * q.growth), needs[name])
        grown[name] = max(sizes[name], min(limits[name], step))
    if policy.length.required:
        # Length pairs with the parent: unless it is served again, its stored answers bound how
        # far a set can grow for the length rules alone.
        for name, rules in _length_growth(stage, parent, baseline, policy).items():
            if name not in sets:
                continue
            reasons[name] += rules
            if name not in growing:
                unbounded = parent is None or parent_served or name not in parent.tasks
                reach = limits[name] if unbounded else min(limits[name],
                                                           len(parent.tasks[name].items))
                grown[name] = max(sizes[name], min(reach, math.ceil(sizes[name] * q.growth)))
    grows = {name for name, n in grown.items() if n > sizes[name]} | set(by_group)
    if not grows:
        return None
    return Look(sizes=grown, reasons={name: reasons[name] for name in grown if name in grows},
                groups=by_group)


def _length_growth(stage: QualityResult, parent: QualityResult | None, baseline: QualityResult,
                   policy: GatePolicy) -> dict[str, list[str]]:
    """The sets to grow while a blocking length rule is inconclusive, each with the open rules
    it grows for: the sets whose own ratio (vs the parent or vs the baseline) is unresolved, or,
    where only the pooled one is, those in which an answer changed length; with no blocking rule
    open, the sets whose own unresolved ratio lies beyond the limit. A set whose answers
    all kept their length (the demo's long-context retrievals, its costliest items) carries no
    drift to resolve: more of it would only dilute the pooled ratio toward x1, a pass bought by
    averaging in zeros."""
    def wrap(name: str, quality: QualityResult) -> StageRecord:
        return StageRecord(name=name, kind="stage", parent=None, axes={}, quality=quality)

    stage_record = wrap("stage", stage)
    parent_record = wrap("parent", parent) if parent is not None else wrap("baseline", baseline)
    base_record = wrap("baseline", baseline)
    names = sorted(stage.tasks)
    most = policy.length.max_censored_share

    def more_can_decide(check) -> bool:
        """A ratio unresolved because most answers ran to the budget stays so with more items:
        how often the model is cut does not change with more of the same items (a sampled
        math set of the demo model, 71 % cut, asked for look after look)."""
        n = check.details.get("n") or 0
        cut = max(check.details.get("cut", 0), check.details.get("reference_cut", 0))
        return not over_censored(cut, n, most, look_alpha(policy.quality.alpha,
                                                          policy.quality.max_looks))

    found = [c for c in length_checks(stage_record, parent_record, policy, base_record,
                                      finish=False)
             if c.status == "inconclusive" and more_can_decide(c)]
    # A set's own ratio is advisory while unresolved, but one whose estimate lies beyond the
    # limit blocks and grows, so that its items can show the drift or clear it (x1.20 in one
    # set, x1.05 pooled, went 35-55 % at the first look's items); where no other blocking rule
    # is open, only those grow.
    if not any(not c.passed and "leans_beyond" not in c.details for c in found):
        found = [c for c in found if c.details.get("leans_beyond")]
    if not found:
        return {}
    open_rules = [c.rule for c in found]
    named = {name: [rule for rule in open_rules
                    if rule in (f"length.{name}", f"length.baseline.{name}")] for name in names}
    if any(named.values()):
        return {name: rules for name, rules in named.items() if rules}
    return {name: open_rules for name, ratios in length_ratios(stage_record, parent_record).items()
            if np.count_nonzero(ratios)}
