from __future__ import annotations

import pytest

from gates.decide import decide, load_records
from gates.policy import GatePolicy, load_policy
from gates.record import RunManifest
from infra.errors import SpecError
from tests.gates.records import chain, paired, record

POLICY = GatePolicy()
BASE_SCORES = [1.0] * 30 + [0.0] * 30


def failed_rules(verdict, stage):
    return [c.rule for s in verdict.stages if s.stage == stage for c in s.failures]


def test_identical_stage_goes():
    verdict = decide("c", [record("baseline", None, BASE_SCORES), record("w", "baseline", BASE_SCORES)],
                     POLICY)
    assert verdict.decision == "go" and verdict.exit_code == 0
    assert verdict.accepted_stage == "w" and verdict.reasons == []


def test_broken_items_roll_back_with_flip_counts():
    broken = [0.0] * 12 + [1.0] * 18 + [0.0] * 30
    verdict = decide("c", [record("baseline", None, BASE_SCORES), record("w", "baseline", broken)],
                     POLICY)
    assert verdict.decision == "rollback" and verdict.exit_code == 1
    assert failed_rules(verdict, "w") == ["quality.accuracy", "quality.math"]
    assert "12 right->wrong, 0 wrong->right" in verdict.reasons[0]
    assert verdict.accepted_stage == "baseline"
    assert verdict.rollback_command == "vllm --model baseline"


def test_balanced_flips_within_tolerance_go_once_the_set_can_tell():
    shuffled = [0.0] + [1.0] * 29 + [1.0] + [0.0] * 29
    verdict = decide("c", [record("baseline", None, BASE_SCORES), record("w", "baseline", shuffled)],
                     POLICY)
    assert verdict.decision == "rollback"  # 60 items: the bound reaches -8.4 pts, score more
    assert "score more items to decide" in verdict.reasons[0]
    verdict = decide("c", [record("baseline", None, BASE_SCORES * 2),
                           record("w", "baseline", shuffled * 2)], POLICY)
    assert verdict.decision == "go", verdict.reasons


def test_perplexity_latency_errors_and_length_each_fail():
    stages = [
        record("baseline", None, BASE_SCORES),
        record("w", "baseline", BASE_SCORES, perplexity=12.0),
        record("a", "w", BASE_SCORES, perplexity=12.0, tpot=40.0, kind="activations"),
        record("kv", "a", BASE_SCORES, perplexity=12.0, tpot=40.0, errors=5,
               lengths=[60] * 60, kind="kv_cache"),
    ]
    stages[2].paired_load = paired("w", ratio=1.6)  # timed against its parent in rounds
    verdict = decide("c", stages, POLICY)
    assert failed_rules(verdict, "w") == ["perplexity.parent"]
    assert failed_rules(verdict, "a") == ["perplexity.baseline", "latency.low.tpot_p50_ms"]
    assert failed_rules(verdict, "kv") == ["perplexity.baseline", "load.low.errors", "load.high.errors",
                                           "length", "length.baseline"]
    assert verdict.accepted_stage == "baseline"


def test_missing_measurements_fail_closed():
    stage = record("w", "baseline", BASE_SCORES)
    stage.load = None
    stage.quality.perplexity = None
    verdict = decide("c", [record("baseline", None, BASE_SCORES), stage], POLICY)
    assert verdict.decision == "rollback"
    assert set(failed_rules(verdict, "w")) == {"perplexity", "load"}


def test_stage_error_and_too_few_items_fail_closed():
    errored = record("w", "baseline", BASE_SCORES)
    errored.error = "engine died"
    verdict = decide("c", [record("baseline", None, BASE_SCORES), errored], POLICY)
    assert verdict.reasons == ["w: stage: stage did not finish: engine died"]
    small = decide("c", [record("baseline", None, [1.0] * 5), record("w", "baseline", [1.0] * 5)],
                   POLICY)
    assert "quality.math" in failed_rules(small, "w") and "length" in failed_rules(small, "w")


def test_later_stage_cannot_be_accepted_when_an_ancestor_failed():
    stages = [
        record("baseline", None, BASE_SCORES),
        record("w", "baseline", BASE_SCORES, perplexity=12.0),
        record("a", "w", BASE_SCORES, perplexity=12.0, kind="activations"),
    ]
    stages[2].quality.perplexity = 12.0
    policy = GatePolicy.model_validate({"perplexity": {"max_increase_vs_baseline": 0.5}})
    verdict = decide("c", stages, policy)
    assert [s.passed for s in verdict.stages] == [True, False, True]
    assert verdict.decision == "rollback" and verdict.accepted_stage == "baseline"


def test_verdict_round_trips_from_stored_records(tmp_path):
    stages = [record("baseline", None, BASE_SCORES), record("w", "baseline", BASE_SCORES)]
    for stage in stages:
        stage.save(tmp_path / stage.name)
    RunManifest(candidate="c", stages=["baseline", "w"]).save(tmp_path)
    candidate, loaded = load_records(tmp_path)
    again = decide(candidate, loaded, POLICY)
    assert again == decide("c", stages, POLICY)
    path = again.save(tmp_path / "verdict.json")
    assert '"schema_version": "2"' in path.read_text()


def test_default_policy_file_loads_and_bad_policy_is_named(tmp_path):
    assert load_policy("default") == GatePolicy()
    bad = tmp_path / "p.yaml"
    bad.write_text("quality: {confidence: 2}\n")
    with pytest.raises(SpecError, match=r"field 'quality.confidence'"):
        load_policy(str(bad))
    with pytest.raises(SpecError, match="not found"):
        load_policy("strict")


def test_emulated_stage_is_not_latency_gated_nor_a_rollback_target():
    stages = [
        record("baseline", None, BASE_SCORES),
        record("w", "baseline", BASE_SCORES, tpot=60.0),
        record("a", "w", BASE_SCORES, kind="activations", perplexity=13.0),
    ]
    stages[1].emulated = True
    verdict = decide("c", stages, POLICY)
    w = next(s for s in verdict.stages if s.stage == "w")
    assert w.passed and any(not c.applicable for c in w.checks)
    assert verdict.decision == "rollback"
    assert verdict.accepted_stage == "baseline", "an emulated stage was never really served"


def test_emulated_candidate_stage_cannot_go():
    stage = record("w", "baseline", BASE_SCORES)
    stage.emulated = True
    verdict = decide("c", [record("baseline", None, BASE_SCORES), stage], POLICY)
    assert verdict.decision == "rollback"
    assert failed_rules(verdict, "w") == ["servable"]


def test_stage_after_an_emulated_parent_is_timed_against_the_baseline():
    stages = [
        record("baseline", None, BASE_SCORES, tpot=25.0),
        record("w", "baseline", BASE_SCORES, tpot=10.0),
        record("a", "w", BASE_SCORES, kind="activations", tpot=60.0),
    ]
    stages[1].emulated = True
    stages[2].paired_load = paired("baseline", ratio=2.4)  # the flow timed it against the baseline
    verdict = decide("c", stages, POLICY)
    a = {c.rule: c for s in verdict.stages if s.stage == "a" for c in s.checks}
    tpot = a["latency.low.tpot_p50_ms"]
    assert "vs baseline" in tpot.reason and not tpot.passed, tpot.reason


def test_a_rule_that_failed_for_good_leads_the_reasons():
    """A stage whose KL is far past its limit and whose quality is still unresolved: the reader
    sees the decisive failure first, then the rules it left inconclusive."""
    shuffled = [0.0] + [1.0] * 29 + [1.0] + [0.0] * 29
    verdict = decide("c", [record("baseline", None, BASE_SCORES),
                           record("w", "baseline", shuffled, kl=0.5)], POLICY)
    statuses = {c.rule: c.status for s in verdict.stages for c in s.failures}
    assert statuses["divergence.kl"] == "fail" and "inconclusive" in statuses.values()
    assert verdict.reasons[0].startswith("w: divergence.kl: ")
    ranks = [statuses[r.split(": ")[1]] == "inconclusive" for r in verdict.reasons]
    assert ranks == sorted(ranks)


def test_a_failing_sibling_branch_or_control_blocks_the_go():
    good = record("w", "baseline", BASE_SCORES)
    bad_sibling = record("x", "baseline", BASE_SCORES, perplexity=14.0)
    verdict = decide("c", [record("baseline", None, BASE_SCORES), bad_sibling, good], POLICY)
    assert verdict.decision == "rollback" and any(r.startswith("x: ") for r in verdict.reasons)
    control = record("control", "baseline", BASE_SCORES, perplexity=14.0, kind="control")
    verdict = decide("c", [record("baseline", None, BASE_SCORES), control, good], POLICY)
    assert verdict.decision == "rollback" and verdict.reasons[0].startswith("control: ")
    assert verdict.accepted_stage == "w"  # the candidate's own chain passed


def test_a_control_stage_that_holds_goes_and_is_never_the_candidate():
    control = record("control", "baseline", BASE_SCORES, kind="control")
    verdict = decide("c", [record("baseline", None, BASE_SCORES), record("w", "baseline", BASE_SCORES),
                           control], POLICY)
    assert verdict.decision == "go", verdict.reasons
    assert verdict.accepted_stage == "w" and "--model w" in verdict.rollback_command
    alone = decide("c", [record("baseline", None, BASE_SCORES), control], POLICY)
    assert alone.decision == "rollback" and "no candidate stage was measured" in alone.reasons


def test_an_emulated_stage_without_load_is_judged_on_quality_and_reported(tmp_path):
    from gates.report import write_report

    stages = chain()
    stages[1].emulated, stages[1].load, stages[1].paired_load = True, None, None
    verdict = decide("c", stages, load_policy("default"))
    latency = [c for s in verdict.stages if s.stage == stages[1].name for c in s.checks
               if c.rule.startswith("latency")]
    assert len(latency) == 1 and not latency[0].applicable and "not measured" in latency[0].reason
    assert not any(c.rule == "load" for s in verdict.stages for c in s.failures)
    report = write_report(verdict, stages, tmp_path / "report")
    assert report["html"].is_file()
