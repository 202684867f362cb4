from __future__ import annotations

import numpy as np
import pytest

from gates import stats
from gates.policy import axis_bits, precision_class


def test_holm_adjusts_step_down_and_stays_monotone():
    adjusted = stats.holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adjusted == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})
    assert stats.holm({}) == {}


def test_exact_mcnemar_counts_only_flips():
    assert stats.mcnemar_worse(0, 0) == 1.0
    assert stats.mcnemar_worse(12, 0) == pytest.approx(0.5**12)
    assert stats.mcnemar_worse(3, 3) > 0.5


def test_bootstrap_ci_covers_the_mean_and_collapses_when_nothing_moved():
    rng = np.random.default_rng(1)
    values = rng.normal(0.2, 1.0, 400)
    ci = stats.mean_ci(values, 0.95, 2000, seed=3)
    assert ci.low < 0.2 < ci.high and ci.high - ci.low == pytest.approx(0.2, abs=0.06)
    assert stats.mean_ci(np.zeros(50), 0.95, 2000, seed=3) == stats.Interval(0.0, 0.0, 0.0)
    again = stats.mean_ci(values, 0.95, 2000, seed=3)
    assert again == ci, "a fixed seed gives the same bound: verdicts are reproducible"


def test_wilcoxon():
    assert stats.wilcoxon_p(np.zeros(30)) == 1.0
    assert stats.wilcoxon_p(np.full(30, 0.2) + np.linspace(0, 0.01, 30)) < 1e-4


def test_precision_class_is_the_narrowest_quantized_axis():
    assert axis_bits("int4/group64") == 4 and axis_bits("fp8_e4m3") == 8 and axis_bits("none") is None
    assert precision_class({"weights": "none", "activations": "none", "kv_cache": "auto"}) == "8bit"
    assert precision_class({"weights": "int8/channel", "activations": "int8/token/dynamic",
                            "kv_cache": "fp8_e4m3"}) == "8bit"
    assert precision_class({"weights": "int4/group64", "activations": "none",
                            "kv_cache": "auto"}) == "4bit"
