"""The what-if reproduces the published H100 table for Qwen2.5-7B (item 2 of issue 14)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gates.whatif import markdown, whatif_table

# Published: one H100 SXM, 1,024 prompt / 256 output tokens, TTFT <= 1 s and TPOT <= 40 ms for
# 99 % of requests; the figures and the stages' axes live beside the benchmark script.
from tools.benchmarks.whatif import PUBLISHED, STAGES, WORKLOAD

CONFIG = json.loads((Path(__file__).with_name("qwen25_7b_config.json")).read_text())


@pytest.fixture(scope="module")
def table():
    return whatif_table(CONFIG, STAGES, ["h100-sxm"], WORKLOAD).set_index("stage")


@pytest.mark.parametrize("stage", list(PUBLISHED))
def test_each_figure_within_ten_percent(table, stage):
    row = table.loc[stage]
    rate, ttft, tpot = PUBLISHED[stage]
    assert row.capacity_rps == pytest.approx(rate, rel=0.10)
    assert row.ttft_ms == pytest.approx(ttft, rel=0.10)
    assert row.tpot_ms == pytest.approx(tpot, rel=0.10)
    # The capacity is a passing rate: its p99s meet the SLO.
    assert row.ttft_p99_ms <= 1000 and row.tpot_p99_ms <= 40


def test_the_lesson_comes_out_of_the_model(table):
    bf16, w4a16, fp8 = (table.loc[name] for name in ("BF16", "W4A16", "W8A8 FP8"))
    # Weight-only 4-bit: low-load TPOT to about a third, capacity barely moves.
    assert 0.25 < w4a16.tpot_ms / bf16.tpot_ms < 0.45
    assert 0.95 < w4a16.capacity_rps / bf16.capacity_rps < 1.2
    # FP8 weights and activations: about twice the capacity.
    assert 1.8 < fp8.capacity_rps / bf16.capacity_rps < 2.3
    assert table.loc["W8A8 FP8 + KV FP8"].capacity_rps >= fp8.capacity_rps


def test_every_row_is_labelled_a_prediction_with_its_source(table):
    assert set(table["label"]) == {"prediction"}
    assert all(source.startswith("roofline, efficiencies compute") for source in table["source"])
    text = markdown(table.reset_index(), WORKLOAD)
    assert text.startswith("**Prediction, not a measurement.**")
    assert "Source: roofline" in text and "| W4A16 | h100-sxm |" in text
