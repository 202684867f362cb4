"""A required latency rule asks for more interleaved rounds while unresolved, judged per look."""

from __future__ import annotations

from gates.decide import decide
from gates.latency import look_confidence, round_looks, wants_more_rounds
from gates.policy import GatePolicy
from tests.gates.records import paired, record

ADVISORY = GatePolicy()
REQUIRED = GatePolicy.model_validate({"latency": {"required": True}})
BASE = [1.0] * 40 + [0.0] * 60


def test_looks_double_up_to_the_budget_and_split_alpha():
    assert round_looks(ADVISORY) == [3]
    assert round_looks(REQUIRED) == [3, 6, 12, 24, 48]
    assert look_confidence(ADVISORY) == 0.95
    assert abs(look_confidence(REQUIRED) - 0.99) < 1e-12


def test_more_rounds_only_while_required_and_unresolved():
    close = paired("baseline", ratio=1.2, rounds=3, drift=0.15, noise=0.05)  # near the +25 %
    assert wants_more_rounds(close, "low", REQUIRED)
    assert not wants_more_rounds(close, "low", ADVISORY)
    assert not wants_more_rounds(close, "high", REQUIRED)  # only the judged level
    between = paired("baseline", ratio=1.2, rounds=4)
    assert wants_more_rounds(between, "low", REQUIRED)  # on to the 6-round look
    clear = paired("baseline", ratio=1.0, rounds=3, drift=0.15, noise=0.01, requests=12)
    assert not wants_more_rounds(clear, "low", REQUIRED)
    budget = paired("baseline", ratio=1.2, rounds=48)
    assert not wants_more_rounds(budget, "low", REQUIRED)


def test_a_step_decided_at_an_early_look_stands():
    """Six clear rounds pass at the 6-round look; what later rounds say does not undo it."""
    clear = paired("baseline", ratio=1.0, rounds=12, drift=0.15, noise=0.01, requests=12)
    stage = record("w", "baseline", BASE, paired_load=clear)
    verdict = decide("c", [record("baseline", None, BASE), stage], REQUIRED)
    tpot = next(c for c in verdict.stages[1].checks if c.rule == "latency.low.tpot_p50_ms")
    assert tpot.status == "pass" and tpot.details["rounds"] in (3, 6)
    assert "looks at 3, 6, 12, 24, 48 rounds" in tpot.reason
