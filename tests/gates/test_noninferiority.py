"""Tango's score bounds, the stratified pooling and the power of the test actually run."""

from __future__ import annotations

import numpy as np
import pytest

from gates.noninferiority import Stratum, look_alpha, score_interval, simulated_power


def test_zero_flips_give_a_bound_that_shrinks_with_items_not_a_zero_width_interval():
    _, low20, high20 = score_interval([Stratum(20, 0, 0)], 0.05)
    _, low80, _ = score_interval([Stratum(80, 0, 0)], 0.05)
    assert low20 == pytest.approx(-high20) and -0.13 < low20 < -0.10
    assert -0.04 < low80 < -0.025


def test_the_issue_collapse_is_unresolved_alone_and_equal_weights_do_not_bury_it():
    est, low, high = score_interval([Stratum(20, 3, 0)], 0.05)
    assert est == -0.15 and low < -0.3 and -0.05 < high < 0
    pooled = score_interval([Stratum(60, 0, 0), Stratum(40, 0, 0), Stratum(20, 3, 0),
                             Stratum(40, 0, 0)], 0.05)
    by_items = score_interval([Stratum(160, 3, 0)], 0.05)
    assert pooled[0] == pytest.approx(-0.0375) and pooled[1] < by_items[1]


def test_the_one_sided_bound_keeps_its_level_at_small_n():
    rng = np.random.default_rng(1)
    for p_broke, p_fixed, n in ((0.10, 0.05, 30), (0.20, 0.15, 60)):
        true = p_fixed - p_broke
        misses = 0
        for _ in range(600):
            broke, fixed, _ = rng.multinomial(n, [p_broke, p_fixed, 1 - p_broke - p_fixed])
            misses += score_interval([Stratum(n, int(broke), int(fixed))], 0.05)[1] > true
        assert misses / 600 < 0.075


def test_power_grows_with_items_and_falls_with_alpha_split_over_looks():
    one = simulated_power([60, 40, 20, 40], 0.08, 0.10, 0.05, draws=4000)
    three = simulated_power([60, 40, 20, 40], 0.08, 0.10, look_alpha(0.05, 3), draws=4000)
    grown = simulated_power([240, 160, 80, 120], 0.08, 0.10, look_alpha(0.05, 3), draws=4000)
    assert three < one < grown and grown > 0.95
    assert simulated_power([240], 0.08, 0.20, 0.05, true_delta=-0.16, draws=4000) < 0.01
