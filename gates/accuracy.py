"""Accuracy rules: paired per-item scores of a stage against its parent and the baseline."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evalsets.results import QualityItem
from gates import stats
from gates.policy import GatePolicy, precision_class
from gates.record import StageRecord, paired_items
from gates.verdict import Check, judged, missing, points


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
        f"{points(d.estimate)} pts, {q.confidence:.0%} CI [{points(d.low)}, {points(d.high)}], "
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
        return [missing("quality", "quality")]
    recovery = policy.tolerance(precision_class(stage.axes)).recovery
    checks: list[Check] = []
    measured: list[tuple[SetStats, bool]] = []
    for name, parent_task in parent.quality.tasks.items():
        rule = f"quality.{name}"
        task = stage.quality.tasks.get(name)
        base_task = baseline.quality.tasks.get(name)
        if task is None or base_task is None:
            checks.append(missing(rule, f"set {name!r}" + ("" if task else " on this stage")))
            continue
        vs_baseline, vs_parent = paired_items(base_task, task), paired_items(parent_task, task)
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


