"""Decision quality: A/A pairs must go, a W4A16-RTN-like candidate must roll back."""

from __future__ import annotations

import numpy as np

from gates.benchmark_aa import aa_pair, false_rollback_rate, identical_aa, main, w4a16_like
from gates.policy import GatePolicy
from gates.record import RunManifest
from tests.gates.records import UNQUANTIZED, chain, record

FAST = GatePolicy.model_validate({"quality": {"bootstrap_resamples": 400}})


def noisy_chain() -> list:
    """Baseline and a stage that flips 16 % of 100 items both ways and jitters lengths."""
    rng = np.random.default_rng(5)
    base = [float(x) for x in rng.random(100) < 0.35]
    stage = [1.0 - s if rng.random() < 0.16 else s for s in base]
    lengths = [int(x) for x in rng.integers(20, 90, 100)]
    jitter = [max(1, n + int(rng.integers(-12, 13))) for n in lengths]
    return [record("baseline", None, base, lengths), record("w", "baseline", stage, jitter)]


def test_aa_pairs_have_no_true_difference_but_real_flips():
    records = noisy_chain()
    a, b = aa_pair(records, np.random.default_rng(0))
    a_items, b_items = a.quality.tasks["math"].items, b.quality.tasks["math"].items
    assert [i.id for i in a_items] == [i.id for i in b_items] and len(set(i.id for i in a_items)) == 100
    assert sum(x.score != y.score for x, y in zip(a_items, b_items, strict=True)) > 5


def test_false_rollback_rate_over_resampled_aa_runs_is_low():
    result = false_rollback_rate(noisy_chain(), FAST, resamples=40, seed=1)
    assert result.resamples == 40 and "exchangeable" in result.noise_source
    assert result.false_rollback_rate <= 0.10, result.blocking_rules


def test_identical_aa_goes_and_w4a16_like_candidate_rolls_back():
    records = chain()
    assert identical_aa(records, GatePolicy()).decision == "go"
    bad = w4a16_like(records, GatePolicy())
    assert bad.decision == "rollback" and bad.stages[-1].precision == "4bit"
    assert {"divergence.kl", "perplexity.parent"} <= {c.rule for c in bad.stages[-1].failures}


def test_stored_four_bit_stage_is_used_when_the_run_has_one():
    records = [record("baseline", None, [1.0] * 40 + [0.0] * 60),
               record("w4", "baseline", [0.0] * 100, axes=UNQUANTIZED | {"weights": "int4/group64"},
                      perplexity=14.0, kl=0.3, top1=0.8)]
    bad = w4a16_like(records, GatePolicy())
    assert bad.candidate == "w4a16 (stored)" and bad.decision == "rollback"


def test_script_prints_the_rate(tmp_path, capsys):
    records = noisy_chain()
    for r in records:
        r.save(tmp_path / r.name)
    RunManifest(candidate="c", stages=[r.name for r in records]).save(tmp_path)
    main(tmp_path, resamples=10, seed=0)
    out = capsys.readouterr().out
    assert "A/A false-rollback rate (quality + length rules):" in out
    assert "identical A/A through decide(): go" in out and "rollback (" in out
