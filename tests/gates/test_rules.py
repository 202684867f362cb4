"""The sign-off rules: non-inferiority bounds, divergence, length drift, latency noise, fail closed."""

from __future__ import annotations

import json
import math

from gates.decide import decide
from gates.policy import GatePolicy
from gates.verdict import Verdict
from tests.gates.records import UNQUANTIZED, chain, paired, paired_tokens, record

POLICY = GatePolicy()
BASE = [1.0] * 40 + [0.0] * 60   # a weak model: 40 % accuracy
INT4 = UNQUANTIZED | {"weights": "int4/group64"}


def with_flips(scores: list[float], broke: int, fixed: int) -> list[float]:
    out = list(scores)
    for i in range(broke):
        out[i] = 0.0
    for i in range(fixed):
        out[40 + i] = 1.0
    return out


def checks(verdict: Verdict, stage: str) -> dict:
    return {c.rule: c for s in verdict.stages if s.stage == stage for c in s.checks}


def test_noisy_but_unbiased_stage_goes_on_the_pooled_bound():
    stage = record("w", "baseline", with_flips(BASE, 4, 4))
    verdict = decide("c", [record("baseline", None, BASE), stage], POLICY)
    assert verdict.decision == "go", verdict.reasons
    pooled = checks(verdict, "w")["quality.accuracy"]
    assert pooled.status == "pass" and pooled.required
    assert -0.08 < pooled.details["ci_low"] < 0 < pooled.details["ci_high"]
    assert "power" in pooled.reason and "4 right->wrong, 4 wrong->right" in pooled.reason


def test_an_unresolved_pooled_bound_rolls_back_and_asks_for_more_items():
    stage = record("w", "baseline", with_flips(BASE, 12, 8))  # -4 pts, 20 % of items flip
    verdict = decide("c", [record("baseline", None, BASE), stage], POLICY)
    assert verdict.decision == "rollback"
    pooled = checks(verdict, "w")["quality.accuracy"]
    assert pooled.status == "inconclusive" and not pooled.passed
    assert "score more items" in pooled.reason


def test_identical_stage_proves_non_inferiority():
    same = record("w", "baseline", BASE, paired_load=paired("baseline"))  # timed in rounds
    verdict = decide("c", [record("baseline", None, BASE), same], POLICY)
    quality = checks(verdict, "w")["quality.math"]
    assert quality.status == "pass" and quality.details["ci_low"] < 0  # a score bound, not 0
    assert checks(verdict, "w")["quality.accuracy"].status == "pass"
    assert verdict.decision == "go" and verdict.advisories == []


def test_no_flips_on_a_small_set_is_not_proof():
    """At n=20 a BCa interval of zero flips has zero width; the score bound does not."""
    small = [1.0] * 8 + [0.0] * 12
    verdict = decide("c", [record("baseline", None, small), record("w", "baseline", small)], POLICY)
    pooled = checks(verdict, "w")["quality.accuracy"]
    assert pooled.status == "inconclusive" and pooled.details["ci_low"] < -0.08
    assert verdict.decision == "rollback"


def test_a_set_that_loses_more_than_its_own_margin_fails():
    verdict = decide("c", [record("baseline", None, BASE),
                           record("w", "baseline", with_flips(BASE, 30, 2))], POLICY)
    quality = checks(verdict, "w")["quality.math"]
    assert quality.status == "fail" and not quality.passed
    assert quality.limit == -0.16 and quality.details["ci_high"] < -0.16
    assert "30 right->wrong, 2 wrong->right" in quality.reason and "McNemar" in quality.reason


def test_flips_within_the_margins_are_shown_not_blocking():
    """-9 pts on 100 items: inside the set margin but not resolved by 100 items."""
    verdict = decide("c", [record("baseline", None, BASE),
                           record("w", "baseline", with_flips(BASE, 10, 1))], POLICY)
    quality = checks(verdict, "w")["quality.math"]
    assert quality.status in ("pass", "inconclusive") and quality.details["p_mcnemar"] < 0.01


def test_a_set_at_the_floor_cannot_vouch():
    zero = [0.0] * 60
    verdict = decide("c", [record("baseline", None, zero), record("w", "baseline", zero)], POLICY)
    math_set = checks(verdict, "w")["quality.math"]
    assert math_set.status == "inconclusive" and "at the floor" in math_set.reason
    pooled = checks(verdict, "w")["quality.accuracy"]
    assert pooled.status == "inconclusive" and "no eval set can vouch" in pooled.reason
    assert verdict.decision == "rollback"


def test_missing_divergence_fails_closed_unless_the_policy_waives_it():
    stage = record("w", "baseline", BASE, kl=None)
    verdict = decide("c", [record("baseline", None, BASE), stage], POLICY)
    assert verdict.decision == "rollback"
    assert "divergence: KL divergence / top-1 agreement vs the baseline was not measured" in (
        verdict.reasons[0].split(": ", 1)[1])
    waived = GatePolicy.model_validate({"divergence": {"required": False}})
    verdict = decide("c", [record("baseline", None, BASE), stage], waived)
    assert verdict.decision == "go" and any("divergence" in a for a in verdict.advisories)


def test_kl_and_top1_limits_follow_the_stage_precision():
    eight = record("w", "baseline", BASE, kl=0.06, top1=0.87)
    verdict = decide("c", [record("baseline", None, BASE), eight], POLICY)
    assert {"divergence.kl", "divergence.top1"} <= {c.rule for c in verdict.stages[1].failures}
    four = record("w", "baseline", BASE, kl=0.06, top1=0.87, axes=INT4)
    verdict = decide("c", [record("baseline", None, BASE), four], POLICY)
    assert verdict.stages[1].precision == "4bit" and verdict.decision == "go", verdict.reasons


def test_four_bit_stage_has_its_own_margin():
    stage = record("w", "baseline", BASE, axes=INT4)
    verdict = decide("c", [record("baseline", None, BASE), stage], POLICY)
    assert checks(verdict, "w")["quality.accuracy"].limit == -0.10
    assert checks(verdict, "w")["quality.math"].limit == -0.20  # the set margin: 2x


def test_a_set_missing_from_the_stage_and_its_parent_is_flagged():
    from evalsets.results import TaskQuality

    base = record("baseline", None, BASE)
    base.quality.tasks["code"] = TaskQuality(task="code", metric="pass@1", value=0.5,
                                             items=base.quality.tasks["math"].items)
    stages = [base, record("w", "baseline", BASE), record("a", "w", BASE, kind="activations")]
    verdict = decide("c", stages, POLICY)
    code = checks(verdict, "a")["quality.code"]
    assert not code.passed and "set 'code' on the stage and the parent" in code.reason
    assert verdict.decision == "rollback"


def test_latency_is_judged_against_the_measured_noise():
    base = record("baseline", None, BASE, raw_samples=True)
    same = record("w", "baseline", BASE, raw_samples=True, tpot=26.0)
    same.paired_load = paired("baseline", ratio=26 / 25)
    verdict = decide("c", [base, same], POLICY)
    tpot = checks(verdict, "w")["latency.low.tpot_p50_ms"]
    assert tpot.status == "pass" and tpot.details["ci_low"] < tpot.details["increase"] < tpot.details[
        "ci_high"]
    slow = record("w", "baseline", BASE, raw_samples=True, tpot=40.0)
    slow.paired_load = paired("baseline", ratio=40 / 25)
    verdict = decide("c", [base, slow], POLICY)
    assert checks(verdict, "w")["latency.low.tpot_p50_ms"].status == "fail"


def test_a_broken_long_context_bucket_fails():
    groups = ["short"] * 50 + ["long"] * 50
    base = [1.0] * 25 + [0.0] * 25 + [1.0] * 25 + [0.0] * 25
    broken = base[:50] + [0.0] * 50
    verdict = decide("c", [record("baseline", None, base, groups=groups),
                           record("w", "baseline", broken, groups=groups)], POLICY)
    bucket = checks(verdict, "w")["quality.math.long"]
    assert bucket.status == "fail" and "25 right->wrong" in bucket.reason
    short = checks(verdict, "w")["quality.math.short"]
    assert short.passed and short.status in ("pass", "inconclusive") and not short.required


def test_verdict_json_carries_the_rollback_plan_and_a_stable_candidate_hash(tmp_path):
    stages = chain()
    stages[2].quality.paired_tokens = paired_tokens(0.5, 0.975, math.log(1.02), math.log(1.01))
    verdict = decide("demo", stages, POLICY)
    assert verdict.decision == "rollback"
    # w8 is emulated: the last configuration really served and accepted is the baseline.
    assert verdict.rollback_plan.stage == "baseline"
    assert verdict.rollback_plan.command == "vllm --model baseline"
    # ... and the plan says why the stage that passed after it is not the one named.
    assert verdict.rollback_plan.passed_emulated == ["w8"]
    assert verdict.rollback_plan.skipped().startswith("stage w8 passed but served dequantized")
    data = json.loads(verdict.save(tmp_path / "verdict.json").read_text())
    assert data["schema_version"] == "2" and data["policy"]["tolerances"]["8bit"]["accuracy_margin"] == 0.08
    rules = {c["rule"]: c for c in data["stages"][2]["checks"]}
    assert rules["divergence.kl"]["status"] == "fail" and rules["quality.math"]["details"]["n"] == 120
    assert verdict.candidate_hash == decide("demo", chain(), POLICY).candidate_hash
    assert Verdict.model_validate(data) == verdict


def test_every_go_rests_on_required_rules_that_resolved():
    verdict = decide("demo", chain(), POLICY)
    assert verdict.decision == "go"
    final = verdict.stages[-1]
    required = [c for c in final.checks if c.required and c.applicable]
    assert required and all(c.status == "pass" for c in required)
    assert {"divergence.kl", "divergence.top1", "perplexity.parent", "length"} <= {
        c.rule for c in required}


def test_perplexity_is_judged_on_the_paired_interval():
    def ppl_check(perplexity: float):
        stage = record("w", "baseline", BASE, perplexity=perplexity)
        verdict = decide("c", [record("baseline", None, BASE), stage], POLICY)
        return checks(verdict, "w")["perplexity.parent"]

    assert ppl_check(10.3).status == "pass"
    assert ppl_check(10.8).status == "fail"
    point_only = record("w", "baseline", BASE, perplexity=10.3)  # no per-token values
    point_only.quality.paired_tokens = None
    verdict = decide("c", [record("baseline", None, BASE), point_only], POLICY)
    check = checks(verdict, "w")["perplexity.parent"]
    assert "point estimate" in check.reason and check.status == "inconclusive" and not check.passed
