"""Decision-quality benchmark: false-rollback rate over resampled A/A runs, and a bad candidate's fate.

    python -m gates.benchmark_aa RUN_DIR [--resamples 200]

A/A pairs are built from a stored run: items are bootstrapped from the baseline, and each item's
two answers are drawn from a real pair (baseline, stage) with the two sides swapped by a fair coin,
so both sides of the pair have the same distribution (no true difference) yet flip and change length
as often as a real quantized stage does. That null is harsher than a true A/A (where a greedy engine
mostly repeats itself) so the rate it gives is an upper bound. The quality and length rules judge
each pair; any blocking check is a false rollback.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evalsets.results import Divergence, QualityItem, QualityResult, TaskQuality
from gates import stats
from gates.accuracy import quality_checks
from gates.decide import decide, load_records
from gates.length import length_checks
from gates.policy import GatePolicy, load_policy, precision_class
from gates.record import StageRecord
from gates.verdict import Verdict
from infra.errors import QuantgateError

QUALITY_AND_LENGTH = ("quality.", "length")


@dataclass
class AAResult:
    resamples: int
    rollbacks: int
    noise_source: str
    blocking_rules: Counter = field(default_factory=Counter)
    advisory_rules: Counter = field(default_factory=Counter)

    @property
    def false_rollback_rate(self) -> float:
        return self.rollbacks / self.resamples

    def rate_ci(self, confidence: float = 0.95) -> stats.Interval:
        return stats.proportion_ci(self.rollbacks, self.resamples, confidence)


def _noise_stage(records: list[StageRecord]) -> StageRecord | None:
    """The first measured non-baseline stage: its pairs with the baseline carry real flip noise."""
    return next((r for r in records[1:] if r.quality and r.quality.tasks and not r.error), None)


def _replica(template: StageRecord, name: str, parent: str | None,
             tasks: dict[str, list[QualityItem]]) -> StageRecord:
    quality = QualityResult(tasks={
        set_name: TaskQuality(task=set_name, metric="accuracy",
                              value=float(np.mean([i.score for i in items])), items=items)
        for set_name, items in tasks.items()
    }, perplexity=template.quality.perplexity if template.quality else None)
    return StageRecord(name=name, kind="baseline" if parent is None else "weights", parent=parent,
                       axes=dict(template.axes), quality=quality, facts=template.facts)


def aa_pair(records: list[StageRecord], rng: np.random.Generator) -> tuple[StageRecord, StageRecord]:
    """One A/A pair: bootstrapped items, the two sides of each item exchanged by a fair coin."""
    baseline = records[0]
    other = _noise_stage(records)
    side_a: dict[str, list[QualityItem]] = {}
    side_b: dict[str, list[QualityItem]] = {}
    for set_name, task in baseline.quality.tasks.items():
        theirs = {i.id: i for i in other.quality.tasks[set_name].items} if (
            other and set_name in other.quality.tasks) else {}
        pairs = [(item, theirs.get(item.id, item)) for item in task.items]
        picks = rng.integers(0, len(pairs), len(pairs))
        swaps = rng.random(len(pairs)) < 0.5
        side_a[set_name], side_b[set_name] = [], []
        for k, (pick, swap) in enumerate(zip(picks, swaps, strict=True)):
            first, second = pairs[pick][::-1] if swap else pairs[pick]
            new_id = f"{first.id}#{k}"  # a bootstrap repeats items: keep ids unique
            side_a[set_name].append(first.model_copy(update={"id": new_id}))
            side_b[set_name].append(second.model_copy(update={"id": new_id}))
    a = _replica(baseline, "A", None, side_a)
    return a, _replica(baseline, "B", "A", side_b)


def false_rollback_rate(records: list[StageRecord], policy: GatePolicy, resamples: int = 200,
                        seed: int = 0) -> AAResult:
    """How often the quality and length rules refuse a candidate that is no different."""
    if not records or records[0].quality is None or not records[0].quality.tasks:
        raise QuantgateError("the run has no measured baseline quality: nothing to resample")
    other = _noise_stage(records)
    source = (f"exchangeable pairs (baseline, {other.name})" if other
              else "identical replicas (no other stage measured)")
    result = AAResult(resamples=resamples, rollbacks=0, noise_source=source)
    rng = np.random.default_rng(seed)
    for _ in range(resamples):
        a, b = aa_pair(records, rng)
        checks = quality_checks(b, a, a, policy) + length_checks(b, a, policy)
        blocking = [c.rule for c in checks if not c.passed]
        result.rollbacks += bool(blocking)
        result.blocking_rules.update(blocking)
        result.advisory_rules.update(c.rule for c in checks if c.passed and c.status == "inconclusive")
    return result


def identical_aa(records: list[StageRecord], policy: GatePolicy) -> Verdict:
    """The baseline against an exact copy of itself (zero KL, full agreement), through decide()."""
    baseline = records[0]
    copy = baseline.model_copy(deep=True, update={"name": "replica", "parent": baseline.name,
                                                  "kind": "weights"})
    copy.quality.divergence = Divergence(tokens=10_000, mean_kl=0.0, kl_ci_low=0.0, kl_ci_high=0.0,
                                         top1_agreement=1.0)
    return decide("a-a", [baseline, copy], policy)


def w4a16_like(records: list[StageRecord], policy: GatePolicy, seed: int = 0) -> Verdict:
    """The stored 4-bit stage against the baseline; or, if the run has none, a W4A16-RTN-like one.

    The synthetic one breaks 30 % of the correct answers, lengthens 40 % of the responses by a third,
    and carries the perplexity (+25 %) and divergence (KL 0.35, top-1 80 %) of INT4 RTN on a
    135M model.
    """
    baseline = records[0]
    stored = next((r for r in records[1:] if precision_class(r.axes) == "4bit" and not r.error), None)
    if stored is not None:
        stored = stored.model_copy(update={"parent": baseline.name})
        return decide("w4a16 (stored)", [baseline, stored], policy)
    return decide("w4a16-rtn (synthetic)", [baseline, synthetic_w4a16(baseline, seed)], policy)


def synthetic_w4a16(baseline: StageRecord, seed: int = 0) -> StageRecord:
    """A W4A16-RTN-like stage made from the baseline's own items (see w4a16_like)."""
    rng = np.random.default_rng(seed)
    bad = baseline.model_copy(deep=True, update={
        "name": "w4a16-rtn", "parent": baseline.name, "kind": "weights",
        "axes": baseline.axes | {"weights": "int4/group64"}})
    for task in bad.quality.tasks.values():
        for item in task.items:
            if item.score >= 0.5 and rng.random() < 0.30:
                item.score, item.response = 0.0, item.response + " (broken)"
            if item.output_tokens and rng.random() < 0.40:
                item.output_tokens = int(item.output_tokens * 4 / 3) + 1
    if bad.quality.perplexity:
        bad.quality.perplexity *= 1.25
    bad.quality.divergence = Divergence(tokens=10_000, mean_kl=0.35, kl_ci_low=0.33,
                                        kl_ci_high=0.37, top1_agreement=0.80)
    return bad


def main(
    run_dir: Path,
    resamples: int = 200,
    seed: int = 0,
    policy: str = "default",
) -> None:
    """Print the A/A false-rollback rate of the quality/length rules and the W4A16 verdict."""
    _, records = load_records(run_dir)
    rules = load_policy(policy)
    result = false_rollback_rate(records, rules, resamples, seed)
    ci = result.rate_ci()
    print(f"run: {run_dir}")
    print(f"A/A noise source: {result.noise_source}")
    print(f"A/A false-rollback rate (quality + length rules): {result.false_rollback_rate:.1%} "
          f"({result.rollbacks}/{result.resamples}; 95% CI {ci.low:.1%}..{ci.high:.1%})")
    for rule, count in result.blocking_rules.most_common():
        print(f"  blocked by {rule}: {count}")
    for rule, count in result.advisory_rules.most_common(5):
        print(f"  advisory (inconclusive, not required) {rule}: {count}")
    same = identical_aa(records, rules)
    print(f"identical A/A through decide(): {same.decision}"
          + ("" if same.decision == "go" else f" <- WRONG: {same.reasons}"))
    bad = w4a16_like(records, rules, seed)
    failed = sorted({c.rule for s in bad.stages for c in s.failures})
    print(f"{bad.candidate}: {bad.decision} ({', '.join(failed) or 'nothing failed'})"
          + ("" if bad.decision == "rollback" else " <- WRONG: a bad candidate went"))


if __name__ == "__main__":
    import typer

    typer.run(main)
