"""Divergence and perplexity rules judged on block-bootstrap intervals computed in gates from the
stored per-token values: reproducible with the policy's seed, never a pass on a point estimate,
and `quantgate gate` re-judging a run by the policy stored with it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from evalsets.results import Divergence, PairedTokens
from gates import stats
from gates.decide import decide
from gates.divergence import divergence_checks, perplexity_checks
from gates.policy import GatePolicy, run_policy, save_run_policy
from gates.record import RunManifest
from tests.gates.records import UNQUANTIZED, record

POLICY = GatePolicy()
BASE = [1.0, 0.0] * 30
W8 = UNQUANTIZED | {"weights": "int8/channel"}
W4 = UNQUANTIZED | {"weights": "int4/group64"}


def tokens(kl: float = 0.002, top1: float = 0.99, vs_baseline: float = 0.0,
           vs_parent: float | None = None, texts: int = 80, per_text: int = 100,
           seed: int = 0, **override) -> PairedTokens:
    """Per-token series with text-level correlation (a hard text shifts all its tokens)."""
    rng = np.random.default_rng(seed)
    n = texts * per_text
    text_shift = np.repeat(rng.normal(0, 0.5, texts), per_text)
    series = {
        "kl": rng.exponential(kl, n) * np.exp(text_shift) / np.exp(0.125),
        "top1_agree": rng.random(n) < top1,
        "nll_diff_vs_baseline": vs_baseline + 0.05 * text_shift + rng.normal(0, 0.1, n),
        "nll_diff_vs_parent": None if vs_parent is None
        else vs_parent + 0.05 * text_shift + rng.normal(0, 0.1, n),
    } | override
    return PairedTokens.from_values(20, [(f"t{i}", per_text) for i in range(texts)], **series)


def stage(paired: PairedTokens | None, axes: dict | None = None, perplexity: float = 10.0,
          name: str = "w", parent: str = "baseline"):
    record_ = record(name, parent, BASE, perplexity=perplexity, axes=axes or W8)
    record_.quality.paired_tokens = paired
    return record_


def by_rule(checks) -> dict:
    return {c.rule: c for c in checks}


# -- the one interval -----------------------------------------------------------------------

def test_blocks_stay_within_one_text():
    labels = stats.blocks([5, 3, 0, 4], block_tokens=2)
    assert labels.tolist() == [0, 0, 1, 1, 2, 3, 3, 4, 5, 5, 6, 6]


def test_block_bootstrap_is_reproducible_with_the_seed_and_covers_the_mean():
    rng = np.random.default_rng(1)
    spans = [50] * 60
    values = np.repeat(rng.normal(0, 1, 60), 50) + rng.normal(0, 1, 3000)
    first = stats.block_bootstrap(values, spans, 25, 0.95, 1000, seed=7)
    assert first == stats.block_bootstrap(values, spans, 25, 0.95, 1000, seed=7)
    assert first != stats.block_bootstrap(values, spans, 25, 0.95, 1000, seed=8)
    assert first.estimate == pytest.approx(values.mean())
    assert first.low < first.estimate < first.high
    # Correlated neighbours: blocks give a wider (honest) interval than single tokens would.
    single = stats.block_bootstrap(values, spans, 1, 0.95, 1000, seed=7)
    assert first.high - first.low > 1.5 * (single.high - single.low)
    narrower = stats.block_bootstrap(values, spans, 25, 0.80, 1000, seed=7)
    assert first.low < narrower.low and narrower.high < first.high


def test_identical_runs_give_a_point_interval():
    assert stats.block_bootstrap(np.zeros(300), [100] * 3, 64, 0.95, 500, 0) == stats.Interval(0, 0, 0)
    with pytest.raises(ValueError, match="values for"):
        stats.block_bootstrap(np.zeros(10), [5, 6], 64, 0.95, 500, 0)


# -- KL and top-1 ---------------------------------------------------------------------------

def test_kl_and_top1_are_judged_on_block_intervals_and_state_the_coarsening():
    checks = by_rule(divergence_checks(stage(tokens(kl=0.003, top1=0.985)), POLICY))
    kl, top1 = checks["divergence.kl"], checks["divergence.top1"]
    assert kl.status == top1.status == "pass"
    assert "top-20 coarsened KL, a lower bound of the full-vocabulary KL" in kl.reason
    assert "top-20" in top1.reason and "block-bootstrap CI over 8000 tokens in 80 spans" in top1.reason
    assert kl.details["ci_low"] < kl.details["mean_kl"] < kl.details["ci_high"] <= POLICY.tolerance(
        "8bit").max_kl
    assert top1.details["ci_low"] < top1.details["top1"] < top1.details["ci_high"]


def test_a_4bit_rtn_like_stage_fails_and_a_borderline_one_is_inconclusive():
    bad = by_rule(divergence_checks(stage(tokens(kl=0.25, top1=0.65), axes=W4), POLICY))
    assert bad["divergence.kl"].status == bad["divergence.top1"].status == "fail"
    limit = POLICY.tolerance("8bit").min_top1
    border = by_rule(divergence_checks(stage(tokens(top1=limit, texts=20)), POLICY))["divergence.top1"]
    assert border.status == "inconclusive" and not border.passed
    assert border.reason.startswith("inconclusive, counts as rollback")


def test_same_records_same_verdict_and_the_seed_comes_from_the_policy():
    baseline = record("baseline", None, BASE)
    first = decide("c", [baseline, stage(tokens(kl=0.004, top1=0.97))], POLICY)
    again = decide("c", [baseline, stage(tokens(kl=0.004, top1=0.97))], POLICY)
    assert first == again
    reseeded = POLICY.model_copy(update={"quality": POLICY.quality.model_copy(update={"seed": 1})})
    other = decide("c", [baseline, stage(tokens(kl=0.004, top1=0.97))], reseeded)
    kl = [by_rule(v.stages[1].checks)["divergence.kl"].details for v in (first, other)]
    assert kl[0]["mean_kl"] == kl[1]["mean_kl"] and kl[0]["ci_high"] != kl[1]["ci_high"]


def test_kl_without_per_token_values_is_never_a_pass():
    old = stage(None)
    old.quality.divergence = Divergence(tokens=4000, mean_kl=0.0001, kl_ci_low=0.0,
                                        kl_ci_high=0.0002, top1_agreement=0.999)
    (check,) = divergence_checks(old, POLICY)
    assert (check.rule, check.status, check.passed) == ("divergence", "inconclusive", False)
    assert "without per-token values" in check.reason and "0.0001" in check.reason
    waived = GatePolicy.model_validate({"divergence": {"required": False}})
    (advisory,) = divergence_checks(old, waived)
    assert advisory.passed and advisory.status == "inconclusive"
    never = stage(None)
    never.quality.divergence = None
    (missing,) = divergence_checks(never, POLICY)
    assert not missing.passed and "was not measured" in missing.reason


def one_block(kl: float = 0.02, count: int = 64) -> PairedTokens:
    return PairedTokens.from_values(20, [("t0", count)], kl=np.full(count, kl),
                                    top1_agree=np.ones(count), nll_diff_vs_baseline=np.zeros(count))


def test_a_corpus_of_fewer_blocks_than_min_blocks_cannot_decide():
    # One 64-token block, KL well within the limit: the old zero-width interval passed it on the
    # point estimate (and 41 % of one-block corpora at 1.5x the limit).
    checks = by_rule(divergence_checks(stage(one_block()), POLICY))
    for check in checks.values():
        assert check.status == "inconclusive" and not check.passed
        assert check.reason.startswith("inconclusive, counts as rollback: the scoring corpus has "
                                       "1 block of <= 64 tokens, fewer than")
        assert "fewer than divergence.min_blocks = 30" in check.reason
        assert "score a longer corpus (>= 30 blocks, e.g. 1,920 tokens" in check.reason
    assert checks["divergence.kl"].details["mean_kl"] == pytest.approx(0.02)
    waived = GatePolicy.model_validate({"divergence": {"required": False}})
    assert all(c.passed and c.status == "inconclusive" for c in divergence_checks(stage(one_block()),
                                                                                   waived))
    baseline = record("baseline", None, BASE)
    (ppl,) = perplexity_checks(stage(one_block(), perplexity=10.0), baseline, baseline, waived)
    assert ppl.status == "inconclusive" and not ppl.passed  # perplexity is always required
    assert "1 block of <= 64 tokens" in ppl.reason and "min_blocks = 30" in ppl.reason


def test_min_blocks_is_counted_in_blocks_within_texts_and_comes_from_the_policy():
    # 29 texts of 100 tokens are 58 blocks: they decide; 29 texts of 64 tokens are 29: they do not.
    decided = by_rule(divergence_checks(stage(tokens(texts=29, per_text=100)), POLICY))
    assert decided["divergence.kl"].status == "pass" and "58 blocks of <= 64" in (
        decided["divergence.kl"].reason)
    short = by_rule(divergence_checks(stage(tokens(texts=29, per_text=64)), POLICY))
    assert short["divergence.kl"].status == "inconclusive" and "has 29 blocks" in (
        short["divergence.kl"].reason)
    enough = by_rule(divergence_checks(stage(tokens(texts=30, per_text=64)), POLICY))
    assert enough["divergence.kl"].status == "pass"
    relaxed = GatePolicy.model_validate({"divergence": {"min_blocks": 20}})
    assert by_rule(divergence_checks(stage(tokens(texts=29, per_text=64)), relaxed))[
        "divergence.kl"].status == "pass"
    with pytest.raises(ValueError, match="min_blocks"):
        GatePolicy.model_validate({"divergence": {"min_blocks": 1}})


# -- perplexity -----------------------------------------------------------------------------

def test_perplexity_point_estimate_without_per_token_values_does_not_pass():
    # +4.9 % under the +5 % limit: it passed on the point estimate before; no interval, no pass.
    checks = perplexity_checks(stage(None, perplexity=10.49), record("baseline", None, BASE),
                               record("baseline", None, BASE), POLICY)
    (check,) = checks
    assert check.rule == "perplexity.parent" and check.status == "inconclusive" and not check.passed
    assert "+4.9% point estimate" in check.reason and "never passes" in check.reason


def test_perplexity_ratios_come_from_the_paired_token_differences():
    baseline = record("baseline", None, BASE)
    small = stage(tokens(vs_baseline=math.log(1.02)), perplexity=10.2)
    (ok,) = perplexity_checks(small, baseline, baseline, POLICY)
    assert ok.status == "pass" and ok.details["ci_low"] < 0.02 < ok.details["ci_high"] < 0.05
    assert ok.value == pytest.approx(0.02, abs=0.01)
    parent = record("p", "baseline", BASE, perplexity=10.5)
    later = stage(tokens(vs_baseline=math.log(1.15), vs_parent=math.log(1.08)), perplexity=11.5,
                  parent="p")
    checks = by_rule(perplexity_checks(later, parent, baseline, POLICY))
    assert checks["perplexity.parent"].status == "fail"  # +8 % > +5 % vs the parent
    assert checks["perplexity.baseline"].status == "fail"  # +15 % > +10 % vs the baseline
    no_parent = stage(tokens(vs_baseline=math.log(1.01)), perplexity=10.1, parent="p")
    checks = by_rule(perplexity_checks(no_parent, parent, baseline, POLICY))
    assert checks["perplexity.baseline"].status == "pass"
    assert checks["perplexity.parent"].status == "inconclusive" and not checks["perplexity.parent"].passed


# -- re-gating a stored run -----------------------------------------------------------------

def _stored_run(tmp_path):
    baseline = record("baseline", None, BASE)
    w = stage(tokens(kl=0.02, top1=0.97), name="w")
    for rec in (baseline, w):
        rec.save(tmp_path / rec.name)
    RunManifest(candidate="c", stages=["baseline", "w"]).save(tmp_path)
    return [baseline, w]


def test_gate_uses_the_policy_stored_with_the_run_unless_told(tmp_path, monkeypatch):
    from flows.cli import app

    records = _stored_run(tmp_path)
    strict = POLICY.model_copy(deep=True)
    strict.tolerances["8bit"].max_kl = 0.005
    save_run_policy(strict, tmp_path)
    assert run_policy(tmp_path)[0] == strict
    seen = []

    def spy(candidate, recs, policy):
        seen.append(policy)
        return decide(candidate, recs, policy)

    monkeypatch.setattr("gates.decide.decide", spy)
    result = CliRunner().invoke(app, ["gate", str(tmp_path)], env={"COLUMNS": "300"})
    assert "policy.json" in result.output and seen[-1] == strict
    assert by_rule(decide("c", records, strict).stages[1].checks)["divergence.kl"].status == "fail"
    CliRunner().invoke(app, ["gate", str(tmp_path), "--policy", "default"])
    assert seen[-1].tolerance("8bit").max_kl != 0.005
    (tmp_path / "policy.json").unlink()  # older runs: the policy inside verdict.json
    (tmp_path / "verdict.json").write_text(json.dumps({"policy": strict.model_dump(mode="json")}))
    CliRunner().invoke(app, ["gate", str(tmp_path)])
    assert seen[-1] == strict


def test_per_token_values_round_trip_through_stage_json(tmp_path):
    records = _stored_run(tmp_path)
    from gates.decide import load_records

    _, loaded = load_records(tmp_path)
    assert loaded[1].quality.paired_tokens == records[1].quality.paired_tokens
    assert np.array_equal(loaded[1].quality.paired_tokens.values("top1_agree"),
                          records[1].quality.paired_tokens.values("top1_agree"))
    assert decide("c", loaded, POLICY) == decide("c", records, POLICY)
