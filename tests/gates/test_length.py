"""The output-length rules: cut answers censored, judged per set, vs the parent and the baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evalsets.results import QualityItem, QualityResult, TaskQuality
from gates.decide import decide
from gates.length import length_checks, length_ratios, over_censored
from gates.policy import GatePolicy
from gates.record import StageRecord
from gates.simulate import stage_lengths
from gates.verdict import Verdict
from tests.gates.records import record

POLICY = GatePolicy()
BASE = [1.0] * 40 + [0.0] * 60


def checks(verdict: Verdict, stage: str) -> dict:
    return {c.rule: c for s in verdict.stages if s.stage == stage for c in s.checks}


def stage(name: str, parent: str | None, sets: dict[str, tuple[np.ndarray, int]]) -> StageRecord:
    """A record whose sets hold answers of the given true lengths, cut at each set's budget."""
    tasks = {}
    for set_name, (true_lengths, budget) in sets.items():
        items = [QualityItem.model_construct(
            id=str(i), prompt_hash="h", response="", score=1.0, group=None, cluster=None,
            output_tokens=int(min(length, budget)),
            finish_reason="length" if length >= budget else "stop")
            for i, length in enumerate(true_lengths)]
        tasks[set_name] = TaskQuality(task=set_name, metric="acc", value=1.0, items=items)
    return StageRecord(name=name, kind="baseline" if parent is None else "weights", parent=parent,
                       axes={}, quality=QualityResult(tasks=tasks))


def grown(rng: np.random.Generator, lengths: np.ndarray, ratio: float) -> np.ndarray:
    """A stage's true lengths from its parent's, as the real stages showed them: half the answers
    keep their length exactly, a changed one is another answer (gates.simulate.stage_lengths)."""
    return stage_lengths(rng, lengths, ratio)


def baseline_lengths(rng: np.random.Generator, n: int, tokens: float) -> np.ndarray:
    return np.maximum(1.0, tokens * rng.lognormal(0.0, 0.5, n))


# name: (items, median answer tokens); budgets at 1.6 x the median cut about 20 % of answers.
SETS = {"math": (120, 70), "business": (100, 90), "code": (80, 120), "long_context": (100, 12)}


def goes(checks_: list) -> bool:
    return all(c.passed for c in checks_)


def rate(trial, trials: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    return sum(trial(rng) for _ in range(trials)) / trials


def one_step(ratio: dict[str, float], cut_share: bool, sets=SETS,
             budget: dict[str, int] | None = None, changed_share: float = 0.5):
    """One stage against its parent; budgets at 1.6x each set's median (`cut_share`) unless
    `budget` names them; `changed_share` of the answers change (a control changes few)."""
    budget = budget or {name: int(tokens * 1.6) if cut_share else 100_000
                        for name, (_, tokens) in sets.items()}

    def trial(rng: np.random.Generator) -> bool:
        base = {name: baseline_lengths(rng, n, tokens) for name, (n, tokens) in sets.items()}
        new = {name: stage_lengths(rng, lengths, ratio.get(name, ratio.get("*", 1.0)),
                                   changed_share)
               for name, lengths in base.items()}
        parent = stage("baseline", None, {name: (base[name], budget[name]) for name in sets})
        child = stage("s1", "baseline", {name: (new[name], budget[name]) for name in sets})
        return goes(length_checks(child, parent, POLICY, parent))

    return trial


def test_an_equivalent_stage_goes_with_a_fifth_of_its_answers_cut_at_the_budget():
    # At twice these sizes (the demo's sets after their extra looks); at these, every set is
    # resolved only about 97 % of the time, and four of them together about 90 %.
    grown_sets = {name: (2 * n, tokens) for name, (n, tokens) in SETS.items()}
    assert rate(one_step({"*": 1.0}, cut_share=True, sets=grown_sets), 100, seed=1) >= 0.90


def test_drift_at_the_limit_with_a_fifth_cut_at_the_budget_rolls_back():
    # Counting a cut answer at its cut length pulls the ratio toward x1: the old rule went 48 %.
    assert rate(one_step({"*": 1.10}, cut_share=True), 100, seed=2) <= 0.10


def test_one_set_drifting_fails_while_a_large_unchanged_set_holds():
    sets = SETS | {"long_context": (300, 12)}
    drift = {"math": 1.15, "business": 1.15, "code": 1.15}
    assert rate(one_step(drift, cut_share=False, sets=sets), 60, seed=3) <= 0.10


def test_small_steps_that_add_up_fail_against_the_baseline():
    sets = {"math": (300, 70), "business": (300, 90)}

    def trial(rng: np.random.Generator) -> tuple[bool, bool]:
        lengths = [{name: baseline_lengths(rng, n, tokens) for name, (n, tokens) in sets.items()}]
        for _ in range(3):
            lengths.append({name: grown(rng, x, 1.05) for name, x in lengths[-1].items()})
        records = [stage(f"s{k}", f"s{k - 1}" if k else None,
                         {name: (x, 100_000) for name, x in step.items()})
                   for k, step in enumerate(lengths)]
        found = length_checks(records[3], records[2], POLICY, records[0])
        return found[0].passed, goes(found)

    rng = np.random.default_rng(4)
    outcomes = [trial(rng) for _ in range(60)]
    assert sum(step for step, _ in outcomes) / 60 >= 0.5  # the last step alone passes...
    assert sum(chain for _, chain in outcomes) / 60 <= 0.10  # ...the chain as a whole does not


def test_output_length_drift_fails_on_its_ci_and_unresolvable_drift_rolls_back():
    longer = record("w", "baseline", BASE, lengths=[46] * 100)  # +15 % on every item
    verdict = decide("c", [record("baseline", None, BASE), longer], POLICY)
    assert checks(verdict, "w")["length"].status == "fail"
    jitter = [41 if i % 3 else 39 for i in range(100)]
    verdict = decide("c", [record("baseline", None, BASE, lengths=[40] * 100),
                           record("w", "baseline", BASE, lengths=jitter)], POLICY)
    length = checks(verdict, "w")["length"]
    assert length.status == "pass"
    # At 97 %: alpha split over the three planned looks.
    assert "x1.008 (97% CI [x1.003, x1.013]) over 100 pairs, 100 changed length" in length.reason
    straddling = [40] * 80 + [70] * 20
    verdict = decide("c", [record("baseline", None, BASE),
                           record("w", "baseline", BASE, lengths=straddling)], POLICY)
    length = checks(verdict, "w")["length"]
    assert length.status == "inconclusive" and not length.passed, length.reason
    assert verdict.decision == "rollback"


def test_empty_answers_are_length_drift_not_skipped_pairs():
    empty = [0] * 30 + [40] * 70
    verdict = decide("c", [record("baseline", None, BASE),
                           record("w", "baseline", BASE, lengths=empty)], POLICY)
    length = checks(verdict, "w")["length"]
    assert length.status == "fail" and length.details["n"] == 100, length.reason


def test_a_set_that_collapses_to_empty_answers_fails_while_the_others_hold():
    lengths = np.full(60, 40.0)
    collapsed = np.where(np.arange(60) < 20, 0.0, 40.0)
    parent = stage("baseline", None, {"math": (lengths, 512), "code": (lengths, 512),
                                      "long_context": (np.full(240, 8.0), 512)})
    child = stage("w", "baseline", {"math": (lengths, 512), "code": (collapsed, 512),
                                    "long_context": (np.full(240, 8.0), 512)})
    found = {c.rule: c for c in length_checks(child, parent, POLICY)}
    assert found["length.code"].status == "fail" and found["length"].status == "fail"
    assert found["length.math"].status == "pass" and found["length.long_context"].status == "pass"
    assert "code x0.292 [x0.179, x0.479] fail" in found["length"].reason
    assert "all sets x0.664" in found["length"].reason  # equal weights: code counts a third
    assert list(found)[0] == "length" and "length.baseline" not in found


def test_answers_the_parent_cut_at_the_budget_count_as_at_least_their_cut_length():
    cut = ["length"] * 40 + ["stop"] * 60
    parent = record("baseline", None, BASE, lengths=[64] * 40 + [40] * 60, finish=cut)
    # The parent's 40 cut answers end well inside the budget now: the stage shrank.
    shorter = record("w", "baseline", BASE, lengths=[20] * 40 + [40] * 60, finish=["stop"] * 100)
    length = checks(decide("c", [parent, shorter], POLICY), "w")["length"]
    assert length.status == "fail" and length.details["n"] == 100, length.reason
    assert "0 stage and 40 parent answers cut at the budget (censored" in length.reason
    # Cut where the parent's were, the same elsewhere (jittered): an equivalent stage, every pair kept.
    jitter = [64] * 40 + [41 if i % 3 else 39 for i in range(60)]
    same = record("w", "baseline", BASE, lengths=jitter, finish=cut)
    length = checks(decide("c", [parent, same], POLICY), "w")["length"]
    assert length.status == "pass" and length.details["n"] == 100, length.reason


def test_stage_answers_cut_at_the_budget_count_as_at_least_their_cut_length():
    rng = np.random.default_rng(5)
    parent_lengths = rng.integers(20, 80, 100)
    true = np.where(rng.random(100) < 0.5, parent_lengths * rng.lognormal(0.25, 0.3, 100),
                    parent_lengths).astype(int)
    budget = 80
    parent = record("baseline", None, BASE, lengths=[int(n) for n in parent_lengths])
    child = record("w", "baseline", BASE, lengths=[int(min(n, budget)) for n in true],
                   finish=["length" if n >= budget else "stop" for n in true])
    length = length_checks(child, parent, POLICY)[0]
    assert length.details["cut"] == 16
    assert "16 stage and 0 parent answers cut at the budget (censored" in length.reason
    truth = np.log(true / parent_lengths).mean()  # what the cut hides
    at_cut_length = length_ratios(child, parent)["math"].mean()  # x1.088: would pass
    assert math.exp(truth) == pytest.approx(1.148, abs=1e-3)
    assert math.exp(at_cut_length) == pytest.approx(1.088, abs=1e-3)
    assert "x1.134 (97% CI [x1.071, x1.200])" in length.reason  # near the truth, not x1.088
    assert length.status == "inconclusive" and not length.passed


def test_a_set_whose_changed_answers_all_ran_into_the_budget_cannot_pass():
    # Every changed answer ran into the budget just above the parent's length, and no answer
    # shows a spread to fit: counted at its cut length the ratio would be x1.03, well within the
    # limit; the truth could be anything longer.
    parent = record("baseline", None, BASE, lengths=[60] * 100)
    child = record("w", "baseline", BASE, lengths=[64] * 40 + [60] * 60,
                   finish=["length"] * 40 + ["stop"] * 60)
    length = length_checks(child, parent, POLICY)[0]
    assert length.status == "inconclusive" and not length.passed
    assert "neither side's uncut answers show a spread to fit: cannot pass" in length.reason
    assert "the ratio is at least x1.019" in length.reason
    assert "ci_high" not in length.details  # no infinities in the verdict's JSON
    assert math.exp(length.details["lower_bound"]) == pytest.approx(1.019, abs=1e-3)


def test_a_set_mostly_cut_on_one_side_cannot_carry_a_fit():
    rng = np.random.default_rng(6)
    parent_lengths = rng.integers(20, 120, 100)
    budget = 50  # cuts about 70 % of the answers
    longer = parent_lengths * 1.1  # 10 % more answers newly cut: no ratio within the budget

    def cut(name: str, parent_name: str | None, lengths: np.ndarray) -> StageRecord:
        return record(name, parent_name, BASE, lengths=[int(min(n, budget)) for n in lengths],
                      finish=["length" if n >= budget else "stop" for n in lengths])

    length = length_checks(cut("w", "baseline", longer), cut("baseline", None, parent_lengths),
                           POLICY)[0]
    assert length.status == "inconclusive" and not length.passed, length.reason
    assert ("of one side's answers cut at the budget, confidently more than a normal fit can "
            "carry (max 50%)" in length.reason)


def test_the_censoring_cap_is_on_the_true_share_not_a_small_sets_reading():
    """At 40 % cut, 20 items read 11 or more cut one run in five: the cap (50 %) refuses a fit
    only where the share's lower bound lies above it (the benchmark's A/A at 40 % cut went 68 %
    with the share read at its point, 98 % so)."""
    alpha = 0.05 / 3
    assert not over_censored(12, 20, 0.5, alpha)  # 60 % of 20: could be 40 %
    assert over_censored(70, 100, 0.5, alpha)  # 70 % of 100: confidently above
    assert not over_censored(55, 100, 0.5, alpha) and over_censored(600, 1000, 0.5, alpha)
    assert not over_censored(0, 0, 0.5, alpha)


def test_too_few_pairs_block_even_where_the_rule_is_advisory():
    lax = GatePolicy.model_validate({"length": {"required": False}})
    parent, child = record("baseline", None, [1.0] * 10), record("w", "baseline", [1.0] * 10)
    length = length_checks(child, parent, lax)[0]
    assert length.status == "inconclusive" and not length.passed
    assert "only 10 pairs with both lengths known (< 20)" in length.reason


def test_each_step_within_its_limit_still_fails_the_chain_against_the_baseline():
    stages = [record("baseline", None, BASE, lengths=[40] * 100),
              record("w", "baseline", BASE, lengths=[43] * 100),   # x1.075 vs its parent
              record("a", "w", BASE, lengths=[46] * 100, kind="activations")]  # x1.070, x1.150
    verdict = decide("c", stages, POLICY)
    assert checks(verdict, "w")["length"].status == "pass"
    assert "length.baseline" not in checks(verdict, "w")  # its parent is the baseline
    found = checks(verdict, "a")
    assert found["length"].status == "pass" and found["length.baseline"].status == "fail"
    assert "vs the baseline x1.150" in found["length.baseline"].reason
    assert verdict.accepted_stage == "w"


def test_length_ratios_are_per_set_and_nonzero_where_an_answer_changed_length():
    parent = stage("baseline", None, {"math": (np.full(30, 40.0), 64),
                                      "long_context": (np.full(30, 8.0), 64)})
    child = stage("w", "baseline", {"math": (np.where(np.arange(30) < 5, 50.0, 40.0), 64),
                                    "long_context": (np.full(30, 8.0), 64)})
    ratios = length_ratios(child, parent)
    assert np.count_nonzero(ratios["math"]) == 5 and not np.count_nonzero(ratios["long_context"])
    assert [c.rule for c in length_checks(child, parent, POLICY, parent)] == [
        "length", "length.math", "length.long_context", "length.finish"]


def test_more_responses_cut_off_at_the_budget_fail():
    before = ["stop"] * 100
    after = ["length"] * 30 + ["stop"] * 70
    verdict = decide("c", [record("baseline", None, BASE, finish=before),
                           record("w", "baseline", BASE, finish=after)], POLICY)
    finish = checks(verdict, "w")["length.finish"]
    assert finish.status == "fail" and "30.0% vs parent 0.0%" in finish.reason


@pytest.mark.parametrize("baseline_is", ["none", "parent"])
def test_no_separate_baseline_rule_when_the_parent_is_the_baseline(baseline_is):
    parent, child = record("baseline", None, BASE), record("w", "baseline", BASE)
    found = length_checks(child, parent, POLICY, None if baseline_is == "none" else parent)
    assert [c.rule for c in found] == ["length", "length.finish"]


def test_a_near_identical_stage_with_one_cut_change_is_judged_on_its_few_changes():
    """A control: 2 of 40 answers changed, one of them cut. Too few uncut changes to fit a spread:
    the fit takes the spread real changed answers show, and the stage passes."""
    lengths = np.array([30.0 + i % 7 for i in range(40)])
    child_lengths = lengths.copy()
    child_lengths[3] += 2
    child_lengths[5] = 600  # cut at the 64-token budget
    parent = stage("baseline", None, {"math": (lengths, 64)})
    child = stage("control", "baseline", {"math": (child_lengths, 64)})
    found = {c.rule: c for c in length_checks(child, parent, POLICY)}
    assert found["length"].status == "pass", found["length"].reason
    assert "1 stage and 0 parent answers cut" in found["length"].reason


def test_a_near_identical_stage_whose_few_changes_all_ran_to_the_budget_goes():
    """A control (the CI run's): 2 of 160 answers changed, both ran to the budget: it goes."""
    lengths = np.array([30.0 + i % 7 for i in range(80)])
    changed = lengths.copy()
    changed[[3, 5]] = 600  # cut at the 64-token budget
    parent = stage("baseline", None, {"math": (lengths, 64), "orders": (lengths, 64)})
    child = stage("control", "baseline", {"math": (changed, 64), "orders": (lengths, 64)})
    found = {c.rule: c for c in length_checks(child, parent, POLICY)}
    assert found["length"].status == "pass", found["length"].reason
    assert found["length.math"].status == "pass" and "ci_high" in found["length.math"].details


def test_where_most_answers_are_cut_a_control_goes_on_the_ratio_within_the_budget():
    """Long answers, a short budget (about 70 % cut on both sides): no normal fit can carry the
    set, and 2 changed answers of 200 that ran to the budget are bounded: the ratio within the
    budget stands in, and the control goes."""
    lengths = np.array([20.0 + 2 * (i % 50) for i in range(100)])
    changed = lengths.copy()
    changed[[3, 5]] = 600
    parent = stage("baseline", None, {"math": (lengths, 50), "orders": (lengths, 50)})
    child = stage("control", "baseline", {"math": (changed, 50), "orders": (lengths, 50)})
    found = {c.rule: c for c in length_checks(child, parent, POLICY)}
    assert found["length"].status == "pass", found["length"].reason
    assert "the ratio within the budget" in found["length"].reason
    assert "2 of 200 answers newly cut at it" in found["length"].reason


def test_answers_a_fitted_set_moves_across_the_budget_leave_a_mostly_cut_set_s_reading_alone():
    """The CI's control: 11 of 120 math answers changed, 3 now run to the 64-token budget and 3
    others no longer do (math, cut about a third, carries its fit); the user's set, most of its
    answers cut at the budget, did not change at all. Counting math's newly cut answers against the
    mostly cut set (3 of 180: Wilson's 97 % upper end 5.2 %) held the control back."""
    math_lengths = np.array([20.0 + (i * 7) % 70 for i in range(120)])
    changed = math_lengths.copy()
    newly, no_longer = [i for i in range(120) if 50 <= math_lengths[i] < 64][:3], [
        i for i in range(120) if math_lengths[i] >= 64][:3]
    changed[newly], changed[no_longer] = 80.0, 40.0
    changed[[0, 1, 2, 3, 4]] += 3
    orders = np.array([10.0 + (i * 3) % 60 for i in range(60)])  # 77 % cut at 24
    parent = stage("baseline", None, {"math": (math_lengths, 64), "orders": (orders, 24)})
    child = stage("control", "baseline", {"math": (changed, 64), "orders": (orders, 24)})
    found = {c.rule: c for c in length_checks(child, parent, POLICY)}
    assert found["length"].status == "pass", found["length"].reason
    assert ("0 of 180 answers newly cut at it in the sets so read (97% CI up to 2.5%), and over "
            "all sets 3 newly cut and 3 no longer") in found["length"].reason


def test_answers_reshuffled_across_the_budget_are_not_read_within_it():
    """An equal number of a mostly cut set's answers ran to the budget and stopped short of it:
    the share cut did not rise, but what the answers that now run past the budget would have
    been is unknown, and too many moved for the ratio within the budget to stand in."""
    lengths = np.array([20.0 + 2 * (i % 50) for i in range(100)])  # 70 % cut at 50
    moved = lengths.copy()
    short = np.flatnonzero(lengths < 50)[:15]
    long = np.flatnonzero(lengths >= 50)[:15]
    moved[short], moved[long] = 90.0, 30.0
    parent = stage("baseline", None, {"math": (lengths, 50), "orders": (lengths, 50)})
    child = stage("w", "baseline", {"math": (lengths, 50), "orders": (moved, 50)})
    found = {c.rule: c for c in length_checks(child, parent, POLICY)}
    assert found["length"].status == "inconclusive" and not found["length"].passed
    assert "confidently more than a normal fit can carry" in found["length.orders"].reason


def mostly_cut(changed_share: float, ratio: float):
    """Math cut at 1.4x its median (about a third); a user's set at 0.8x (about 65 % cut)."""
    return one_step({"orders": ratio}, True, {"math": (120, 70), "orders": (60, 40)},
                    {"math": 98, "orders": 32}, changed_share)


def test_beside_a_mostly_cut_set_a_control_goes_and_drift_at_the_limit_rolls_back():
    # A control changes about 6 % of its answers: counting a fitted set's cut answers against
    # the mostly cut one, it went 85 %. A quantized stage changes half: x1.10 in the mostly cut
    # set alone must not pass for reading its answers within the budget.
    assert rate(mostly_cut(0.06, 1.0), 300, seed=7) >= 0.95
    assert rate(mostly_cut(0.5, 1.10), 300, seed=8) <= 0.05


def test_a_set_whose_own_ratio_leans_beyond_the_limit_blocks_and_grows_though_the_pool_passes():
    """A set's own unresolved ratio does not block, but one lying beyond the limit does, and
    grows: x1.20 in math alone went 35 % at the first look's items (the pooled ratio, x1.05,
    passes), 16 % when math grew until its items showed the drift and the lean was advisory,
    and code's 41.6 % (1,000 runs: python -m tools.benchmarks.decisions --only x1.20)."""
    from gates.accuracy import more_items

    def quality(lengths: dict[str, list[int]]) -> QualityResult:
        return QualityResult(tasks={name: TaskQuality(task=name, metric="acc", value=0.5, items=[
            QualityItem.model_construct(id=str(i), prompt_hash="h", response="",
                                        score=float(i % 2), group=None, cluster=None,
                                        output_tokens=n, finish_reason="stop")
            for i, n in enumerate(values)]) for name, values in lengths.items()})

    plain = {name: [40 + i % 7 for i in range(100)] for name in ("business", "code")}
    math_base = [60 + i % 11 for i in range(60)]
    # Every other answer 1.8x longer, the rest 0.73x: x1.15 on average, scattered (unresolved).
    math_stage = [round(n * (1.8 if i % 2 else 0.73)) for i, n in enumerate(math_base)]
    base = quality(plain | {"math": math_base})
    leaning = quality(plain | {"math": math_stage})
    found = {c.rule: c for c in length_checks(
        StageRecord(name="s", kind="stage", parent="b", axes={}, quality=leaning),
        StageRecord(name="b", kind="baseline", parent=None, axes={}, quality=base), POLICY)}
    assert found["length"].status == "pass"
    assert found["length.math"].status == "inconclusive" and not found["length.math"].passed
    assert found["length.math"].required and found["length.math"].details["leans_beyond"]
    assert {c.rule for c in found.values() if not c.passed} == {"length.math"}
    pools = {"math": 1000, "business": 300, "code": 160}
    assert more_items(leaning, base, "8bit", POLICY, pools) == {
        "math": 120, "business": 100, "code": 100}
    # Within the limit (x1.0 on average, as scattered), an unresolved set is left as it is.
    even = [round(n * (1.37 if i % 2 else 0.73)) for i, n in enumerate(math_base)]
    assert more_items(quality(plain | {"math": even}), base, "8bit", POLICY, pools) is None
    within = {c.rule: c for c in length_checks(
        StageRecord(name="s", kind="stage", parent="b", axes={},
                    quality=quality(plain | {"math": even})),
        StageRecord(name="b", kind="baseline", parent=None, axes={}, quality=base), POLICY)}
    assert within["length.math"].passed and not within["length.math"].details["leans_beyond"]
