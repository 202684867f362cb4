"""The one-line summary each finished stage prints."""

from __future__ import annotations

from flows.summary import stage_summary
from gates.policy import load_policy
from tests.gates.records import chain, record


def test_a_finished_stage_prints_its_numbers_and_the_rules_it_fails_so_far():
    records = chain()
    line = stage_summary(records[1], records[:2], load_policy("default"), 83.4)
    assert line.startswith(f"stage {records[1].name} ({records[1].kind}) done in 83 s; ")
    assert "TTFT " in line and " ms (low load)" in line
    # w8 serves emulated weights: a failure only while it is the last stage measured so far.
    assert line.endswith("; failing: servable")
    line = stage_summary(records[1], records[:2], load_policy("default"), 83.4, final=False)
    assert line.endswith("; no rule failed yet")
    line = stage_summary(records[2], records, load_policy("default"), 60)
    assert line.endswith("; no rule failed yet")


def test_a_baseline_whose_budget_cuts_most_answers_says_to_raise_it():
    """Said once the baseline is measured, in its stage line: a budget that cuts most answers
    leaves lengths seen only up to it, which a later stage's length rule cannot see past."""
    scores = [1.0, 0.0] * 30
    cut = record("baseline", None, scores, lengths=[32] * 58 + [20, 25], finish=["length"] * 58
                 + ["stop"] * 2)
    line = stage_summary(cut, [cut], load_policy("default"), 80)
    assert line.endswith("; math: 97% of the answers cut at the budget (32 tokens; a normal fit "
                         "carries at most 50%): its lengths are seen only up to it, and the length "
                         "rule passes a later stage on it only while few answers newly reach it; "
                         "raise its max_gen_toks so the answers fit"), line
    # Half cut is within what a fit carries (the Wilson interval's lower end is under 50 %).
    some = record("baseline", None, scores, lengths=[32, 20] * 30, finish=["length", "stop"] * 30)
    assert "max_gen_toks" not in stage_summary(some, [some], load_policy("default"), 80)


def test_a_failed_stage_prints_why():
    records = chain()
    broken = records[1].model_copy(update={"error": "engine died\nlog tail"})
    line = stage_summary(broken, [records[0], broken], load_policy("default"), 5)
    assert line.endswith(": FAILED: engine died")


def test_stage_timings_add_up_and_reach_mlflow():
    from flows.timing import stage_timings
    from flows.tracking import stage_metrics

    record = chain()[2]
    for task in record.quality.tasks.values():
        task.seconds = 40.0
    record.quality.scoring_s = 10.0
    record.facts.startup_s = 30.0
    timings = stage_timings(record, {"load": 50.0, "more_items": 5.0}, wall_s=150.0)
    assert timings.busy_s == 40.0 * len(record.quality.tasks) + 10.0 + 5.0 + 50.0
    assert timings.overhead_s == max(0.0, 150.0 - 30.0 - timings.busy_s)
    assert all(t.items == len(record.quality.tasks[n].items) for n, t in timings.sets.items())
    record.timings = timings
    metrics = stage_metrics(record)
    assert metrics["time.wall_s"] == 150.0 and metrics["time.load_s"] == 50.0
    assert metrics["time.busy_share"] == round(timings.busy_s / 150.0, 4)
