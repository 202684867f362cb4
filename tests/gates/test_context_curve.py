"""Accuracy per context length: the AUC reads as an accuracy, its change is paired, and the report
shows the table."""

from __future__ import annotations

import numpy as np
import pytest

from gates.context_curve import auc, auc_change, bucket_length, curve_tables, weights
from tests.gates.records import chain, record


@pytest.mark.parametrize(("label", "tokens"), [("512", 512), ("8k", 8192), ("128k", 131072),
                                               ("40k", 40960), ("easy", None), ("k", None)])
def test_bucket_labels_are_lengths(label, tokens):
    assert bucket_length(label) == tokens


def test_auc_is_an_accuracy_over_log_length():
    doublings = [512, 1024, 2048, 4096, 8192]
    assert auc(doublings, [0.7] * 5) == pytest.approx(0.7)
    assert auc([1024, 2048], [1.0, 0.0]) == pytest.approx(0.5)
    assert weights([1024, 2048, 4096]).tolist() == pytest.approx([0.25, 0.5, 0.25])
    assert auc([4096], [0.3]) == pytest.approx(0.3)
    # Each doubling weighs alike: 32k -> 40k is a third of a doubling.
    uneven = weights([16384, 32768, 40960])
    assert uneven.sum() == pytest.approx(1.0) and uneven[2] < uneven[0]


def _set(name, scores, groups):
    return record(name, None if name == "baseline" else "baseline", scores, groups=groups
                  ).quality.tasks["math"]


def test_auc_change_is_paired_and_its_interval_excludes_zero_only_for_real_damage():
    groups = [("1k", "2k", "4k", "8k")[i % 4] for i in range(160)]
    base_scores = [float(i % 5 != 0) for i in range(160)]  # 80 % right in every bucket
    base = _set("baseline", base_scores, groups)
    same = auc_change(_set("s", base_scores, groups), base)
    assert same == pytest.approx((0.0, 0.0, 0.0))
    broken = [0.0 if g == "8k" else s for s, g in zip(base_scores, groups, strict=True)]
    change, low, high = auc_change(_set("s", broken, groups), base)
    # 8k carries 1/6 of the area (trapezoid over three doublings): 0.8 lost there.
    assert change == pytest.approx(-0.8 / 6)
    assert low < change < high < 0
    noisy = list(base_scores)
    noisy[3], noisy[7] = 1.0 - noisy[3], 1.0 - noisy[7]  # two 8k flips: no clear change
    _, low, high = auc_change(_set("s", noisy, groups), base)
    assert low < 0 < high


def test_sets_without_length_groups_have_no_curve():
    plain = _set("baseline", [1.0, 0.0], ["easy", "hard"])
    assert auc_change(plain, plain) is None
    records = [record("baseline", None, [1.0, 0.0], groups=["easy", "hard"])]
    assert curve_tables(records) == []


def test_curve_table_per_stage_with_accuracy_per_bucket():
    records = chain()
    (table,) = curve_tables(records)
    assert table["set"] == "math" and table["buckets"] == ["1k", "2k", "4k", "8k"]
    rows = {row["stage"]: row for row in table["rows"]}
    assert list(rows) == ["baseline", "w8", "a8"]
    assert rows["baseline"]["change"] == "-"
    items = records[0].quality.tasks["math"].items
    at_1k = np.mean([i.score >= 0.5 for i in items if i.group == "1k"])
    assert rows["baseline"]["cells"][0] == f"{at_1k:.0%} (30)"
    assert rows["w8"]["change"].startswith(("+", "-")) and "[" in rows["w8"]["change"]


def test_report_shows_the_curve_table(tmp_path):
    from gates.decide import decide
    from gates.policy import GatePolicy
    from gates.report import write_report

    records = chain()
    paths = write_report(decide("demo", records, GatePolicy()), records, tmp_path)
    markdown = paths["md"].read_text()
    assert "| math: stage | 1k | 2k | 4k | 8k | AUC | AUC change vs baseline" in markdown
    assert 'id="context-curve-math"' in paths["html"].read_text()


def test_a_kv_stage_is_judged_per_bucket_of_the_family_and_the_curve_shows_the_drop():
    import json
    from pathlib import Path

    from evalsets.results import QualityItem, QualityResult, TaskQuality
    from gates.accuracy import quality_checks
    from gates.policy import GatePolicy
    from gates.record import StageRecord

    data = Path(__file__).resolve().parents[2] / "evalsets/context_ruler/data.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]

    def stage(name, parent, wrong_in, axes):
        items = [QualityItem(id=r["id"], prompt_hash="h", response="", group=r["bucket"],
                             # 2 of every bucket's 20 wrong, and every item of `wrong_in`
                             score=0.0 if r["bucket"] == wrong_in or int(r["id"][-3:]) % 10 == 0
                             else 1.0)
                 for r in rows]
        task = TaskQuality(task="context_ruler", metric="match_all", items=items,
                           value=sum(i.score for i in items) / len(items))
        return StageRecord(name=name, kind="baseline" if parent is None else "kv_cache",
                           parent=parent, axes=axes,
                           quality=QualityResult(tasks={"context_ruler": task}))

    plain = {"weights": "bf16", "activations": "bf16", "kv_cache": "auto"}
    baseline = stage("baseline", None, None, plain)
    kv = stage("kv", "baseline", "8k", plain | {"kv_cache": "fp8_e4m3"})
    checks = {c.rule: c for c in quality_checks(kv, baseline, baseline, GatePolicy())}
    assert checks["quality.context_ruler.8k"].status == "fail"
    assert {checks[f"quality.context_ruler.{b}"].status for b in ("512", "1k", "2k", "4k")} == {
        "pass"}
    (table,) = curve_tables([baseline, kv])
    assert table["buckets"] == ["512", "1k", "2k", "4k", "8k"]
    assert [row["cells"][-1] for row in table["rows"]] == ["90% (20)", "0% (20)"]
    change = table["rows"][1]["change"]
    assert change.startswith("-11.2 [")  # 8k carries 1/8 of the area: 0.9 / 8 lost
