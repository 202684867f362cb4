"""The one-line summary each finished stage prints."""

from __future__ import annotations

from flows.acceptance import stage_summary
from gates.policy import load_policy
from tests.gates.records import chain


def test_a_finished_stage_prints_its_numbers_and_the_rules_it_fails_so_far():
    records = chain()
    line = stage_summary(records[1], records[:2], load_policy("default"), 83.4)
    assert line.startswith(f"stage {records[1].name} ({records[1].kind}) done in 83 s; ")
    assert "TTFT " in line and " ms (low load)" in line
    assert "no rule failed yet" in line or "failing: " in line


def test_a_failed_stage_prints_why():
    records = chain()
    broken = records[1].model_copy(update={"error": "engine died\nlog tail"})
    line = stage_summary(broken, [records[0], broken], load_policy("default"), 5)
    assert line.endswith(": FAILED: engine died")
