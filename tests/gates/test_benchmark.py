"""Decision quality through decide(): the rows whose answer is not in doubt."""

from __future__ import annotations

import numpy as np

from gates.benchmark import Scenario, main, p_go, scenarios, trial
from gates.policy import GatePolicy

POLICY = GatePolicy()


def row(label: str) -> Scenario:
    return next(s for s in scenarios(POLICY) if s.label.startswith(label))


def test_an_equivalent_stage_goes_even_at_fifteen_percent_flips():
    rate, blocking = p_go(row("accuracy drop 0 pts, 15% flips"), POLICY, trials=12, seed=3)
    assert rate >= 11 / 12, blocking


def test_twice_the_margin_and_the_collapse_roll_back():
    assert p_go(row("accuracy drop 16 pts (2x margin), 5% flips"), POLICY, 8, 1)[0] == 0
    rate, blocking = p_go(row("collapse"), POLICY, trials=8, seed=2)
    assert rate == 0 and blocking.get("quality.code", 0) >= 6, blocking


def test_creep_over_a_chain_is_caught_against_the_baseline():
    verdict = trial(row("creep: -4 pts"), POLICY, np.random.default_rng(4))
    assert verdict.decision == "rollback"
    assert any(r.startswith("s3: quality.accuracy") for r in verdict.reasons), verdict.reasons


def test_adaptive_looks_add_items_only_when_needed():
    rng = np.random.default_rng(5)
    verdict = trial(Scenario("aa", [0.0], flips=0.15), POLICY, rng)
    pooled = next(c for c in verdict.stages[1].checks if c.rule == "quality.accuracy")
    assert pooled.details["n"] >= 100 and pooled.details["sets"] >= 3
    assert verdict.decision == "go", verdict.reasons


def test_the_script_prints_the_table(capsys):
    main(["--trials", "2", "--only", "collapse"])
    out = capsys.readouterr().out
    assert "P(go)" in out and "collapse: code 3/20 -> 0/20" in out
