"""Sampled sets in the gates: an item's k samples are k pairs of one cluster, never k items; the
reasoning trace's length is a length rule of its own."""

from __future__ import annotations

import numpy as np

from evalsets.results import QualityItem, QualityResult, TaskQuality
from gates.accuracy import SetCounts, quality_checks
from gates.length import length_checks
from gates.policy import GatePolicy
from gates.record import StageRecord, paired_items

POLICY = GatePolicy()
W8A8 = {"weights": "int8/channel", "activations": "int8/token/dynamic", "kv_cache": "auto"}


def sampled(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """k samples per item, right with the item's own chance (items are easy or hard)."""
    chance = rng.beta(0.6, 0.6, n)
    return rng.random((n, k)) < chance[:, None]


def flipped(rng: np.random.Generator, answers: np.ndarray, broke: float, fixed: float) -> np.ndarray:
    u = rng.random(answers.shape)
    return np.where(answers, u >= broke, u < fixed)


def record(name: str, answers: np.ndarray, traces: list[int] | None = None,
           parent: str | None = "baseline") -> StageRecord:
    items = [QualityItem(id=str(i), prompt_hash="h", response="", score=float(row.mean()),
                         samples=[float(x) for x in row], output_tokens=50, finish_reason="stop",
                         reasoning_tokens=None if traces is None else traces[i])
             for i, row in enumerate(answers)]
    quality = QualityResult(tasks={"math": TaskQuality(task="math", metric="acc", items=items,
                                                       value=float(answers.mean()))})
    return StageRecord(name=name, kind="baseline" if name == "baseline" else "activations",
                       parent=None if name == "baseline" else parent, quality=quality,
                       axes=W8A8 if name != "baseline" else {})


def rules(stage: StageRecord, baseline: StageRecord) -> dict:
    return {c.rule: c for c in quality_checks(stage, baseline, baseline, POLICY)}


def counts(base: np.ndarray, stage: np.ndarray) -> SetCounts:
    b, s = record("baseline", base), record("s1", stage)
    return SetCounts.of("quality.math", paired_items(b.quality.tasks["math"],
                                                     s.quality.tasks["math"]), [])


def test_k_samples_count_as_pairs_of_one_cluster_not_as_items():
    rng = np.random.default_rng(1)
    base = sampled(rng, 120, 4)
    # Flips on their own per sample: the samples are independent pairs (design effect 1).
    apart = counts(base, flipped(rng, base, 0.05, 0.05))
    assert (apart.n, apart.items, apart.samples) == (480, 120, 4)
    assert apart.design_effect < 1.2
    assert "4 samples of each of 120 items" in apart.summary()
    # A stage that breaks an item in every sample: its 4 pairs are one, the interval widens.
    broken = rng.random(120) < 0.1
    together = counts(base, np.where(broken[:, None], ~base, base))
    assert together.design_effect > 2.5, together.design_effect
    assert "items as clusters: design effect" in together.summary()
    # The items to grow to are items, not samples.
    alone = SetCounts(**{**together.__dict__, "samples": 1})
    assert abs(together.needed(0.08, 0.025, 0.9) * 4 - alone.needed(0.08, 0.025, 0.9)) <= 4


def test_an_equivalent_sampled_stage_goes_and_one_that_loses_a_fifth_fails():
    rng = np.random.default_rng(2)
    base = sampled(rng, 400, 4)
    baseline = record("baseline", base)
    same = rules(record("s1", flipped(rng, base, 0.04, 0.04)), baseline)
    assert same["quality.accuracy"].status == "pass", same["quality.accuracy"].reason
    assert same["quality.math"].details["samples"] == 4
    worse = rules(record("s1", flipped(rng, base, 0.45, 0.02)), baseline)
    assert worse["quality.accuracy"].status == "fail", worse["quality.accuracy"].reason


def test_a_stage_whose_reasoning_doubles_fails_the_trace_length_rule_only():
    rng = np.random.default_rng(3)
    base = sampled(rng, 200, 1)
    traces = [int(x) for x in rng.integers(200, 400, 200)]
    parent = record("baseline", base, traces)
    longer = record("s1", base, [2 * t for t in traces])
    checks = {c.rule: c for c in length_checks(longer, parent, POLICY)}
    assert checks["length.reasoning"].status == "fail", checks["length.reasoning"].reason
    assert "parent's trace" in checks["length.reasoning"].reason
    assert checks["length"].status == "pass"  # the answers kept their length
    kept = {c.rule: c for c in length_checks(record("s1", base, traces), parent, POLICY)}
    assert kept["length.reasoning"].status == "pass"
    plain = {c.rule for c in length_checks(record("s1", base), record("baseline", base), POLICY)}
    assert "length.reasoning" not in plain


def test_the_pooled_power_plan_counts_k_samples_as_less_than_k_items():
    from gates.accuracy import plan_power

    def power(items: int, samples: int = 1) -> float:
        return plan_power({"math": items}, {"math": 10_000}, "8bit", POLICY,
                          {"math": samples}).power

    assert power(20) < power(20, 4) < power(80)
