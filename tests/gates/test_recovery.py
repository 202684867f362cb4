"""The model card's recovery table: ratios and intervals that match a direct bootstrap, files."""

from __future__ import annotations

import numpy as np
from scipy import stats

from evalsets.results import QualityItem, TaskQuality
from gates.decide import decide
from gates.policy import GatePolicy
from gates.recovery import AVERAGE, model_card, recovery_table
from gates.report import write_report
from tests.gates.records import chain, record


def _scores(n: int, correct: int, seed: int) -> list[float]:
    out = np.zeros(n)
    out[np.random.default_rng(seed).permutation(n)[:correct]] = 1
    return [float(x) for x in out]


def test_recovery_is_the_ratio_with_an_interval_like_a_direct_paired_bootstrap():
    base = _scores(400, 240, seed=1)
    cand = list(base)
    flipped = [i for i, s in enumerate(base) if s][:30]  # 30 right->wrong, 6 wrong->right
    for i in flipped:
        cand[i] = 0.0
    for i in [i for i, s in enumerate(base) if not s][:6]:
        cand[i] = 1.0
    table = recovery_table(record("baseline", None, base), record("w4", "baseline", cand),
                           GatePolicy())
    (row,) = table.rows
    assert row.items == 400 and row.baseline == 0.6 and row.candidate == 0.54
    assert abs(row.recovery.estimate - 0.9) < 1e-12
    b, c = np.array(base), np.array(cand)
    direct = stats.bootstrap((b, c), lambda x, y, axis=-1: y.mean(axis) / x.mean(axis),
                             paired=True, vectorized=True, n_resamples=4000, method="percentile",
                             random_state=np.random.default_rng(0)).confidence_interval
    assert row.recovery.low < 0.9 < row.recovery.high
    assert abs(row.recovery.low - direct.low) < 0.01 and abs(row.recovery.high - direct.high) < 0.01
    assert row.recovery.high < 1.0  # 24 net losses in 240 correct: clearly below full recovery


def test_equal_answers_recover_fully_and_a_zero_baseline_has_no_ratio():
    same = _scores(50, 20, seed=2)
    table = recovery_table(record("baseline", None, same), record("w8", "baseline", same),
                           GatePolicy())
    assert (table.rows[0].recovery.low, table.rows[0].recovery.high) == (1.0, 1.0)
    zero = recovery_table(record("baseline", None, [0.0] * 10),
                          record("w8", "baseline", [1.0] * 10), GatePolicy())
    assert zero.rows[0].recovery is None


def test_clusters_resample_together_and_widen_the_interval():
    # 30 templates of 10 items, each template answered alike: 30 independent units, not 300.
    per_template = _scores(30, 18, seed=3)
    base = [s for s in per_template for _ in range(10)]
    cand = [0.0 if t in (0, 3, 5) and s else s for t, s in enumerate(per_template)
            for _ in range(10)]
    before, after = record("baseline", None, base), record("w4", "baseline", cand)
    plain = recovery_table(before, after, GatePolicy()).rows[0].recovery
    for stage in (before, after):
        for i, item in enumerate(stage.quality.tasks["math"].items):
            item.cluster = f"t{i // 10}"
    grouped = recovery_table(before, after, GatePolicy()).rows[0].recovery
    assert grouped.estimate == plain.estimate
    assert grouped.high - grouped.low > 2 * (plain.high - plain.low)


def test_average_row_weighs_each_set_alike():
    before, after = record("baseline", None, [1.0] * 10), record("w4", "baseline", [1.0] * 10)
    items = [QualityItem(id=str(i), prompt_hash="h", response="", score=float(i < 50))
             for i in range(100)]
    worse = [item.model_copy(update={"score": float(i < 25)}) for i, item in enumerate(items)]
    before.quality.tasks["code"] = TaskQuality(task="code", metric="pass", value=0.5, items=items)
    after.quality.tasks["code"] = TaskQuality(task="code", metric="pass", value=0.25, items=worse)
    rows = {r.task: r for r in recovery_table(before, after, GatePolicy()).rows}
    assert rows["code"].recovery.estimate == 0.5 and rows["math"].recovery.estimate == 1.0
    # (1.0 + 0.25) / (1.0 + 0.5), not the item-weighted 35 / 60
    assert abs(rows[AVERAGE].recovery.estimate - 1.25 / 1.5) < 1e-12
    assert rows[AVERAGE].items == 110


def test_report_and_model_card_carry_the_table_and_mark_emulated_stages(tmp_path):
    records = chain()
    records[2].emulated = True  # the shipped candidate measured on an emulated format
    verdict = decide("demo", records, GatePolicy())
    paths = write_report(verdict, records, tmp_path, whatif_gpus=())
    card = paths["model_card"].read_text()
    lines = [line for line in card.splitlines() if line.startswith("|")]
    assert lines[0].startswith("| Task | Metric | Baseline | demo† | Recovery [95% CI] | Items |")
    cells = [cell.strip() for cell in lines[2].strip("|").split("|")]
    base = records[0].quality.tasks["math"].value
    cand = records[2].quality.tasks["math"].value
    assert cells[0] == "math" and cells[2] == f"{100 * base:.1f}"
    assert cells[3] == f"{100 * cand:.1f}†" and cells[5] == "120"
    assert cells[4].startswith(f"{cand / base:.1%} [")
    assert "† measured on an emulated format" in card
    md = paths["md"].read_text()
    assert "## Recovery (model card)" in md and "### w8 (emulated)" in md and "### a8" in md
    html = paths["html"].read_text()
    assert 'id="recovery-a8"' in html
    assert "<td>120</td></tr>" in html and "built-in method" not in html  # the items, not dict.items


def test_no_card_without_quality_of_the_last_stage(tmp_path):
    records = chain()
    records[2].quality = None
    assert model_card(records, GatePolicy(), "demo") is None
