"""The one-line summary each finished stage prints."""

from __future__ import annotations

from flows.summary import stage_summary
from gates.policy import load_policy
from tests.gates.records import chain


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
