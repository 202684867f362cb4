"""The bounded capacity search and the judgement of one tried rate."""

from __future__ import annotations

import pytest

from load.capacity import MAX_DISPATCH_LAG_MS, capacity_step, search_capacity
from load.profile import Slo
from load.results import CapacityStep, LoadSample


def step(rate: float, passed: bool) -> CapacityStep:
    return CapacityStep(rate=rate, achieved_rate=rate, requests=10, errors=0,
                        goodput=1.0 if passed else 0.5, passed=passed)


def threshold_server(capacity: float):
    return lambda rate: step(rate, rate <= capacity)


def test_bisection_brackets_the_true_capacity():
    found, note, trace = search_capacity(threshold_server(3.1), 0.5, 8.0, iterations=6)
    assert [s.rate for s in trace[:2]] == [0.5, 8.0]
    assert len(trace) == 8
    assert found <= 3.1
    failing = min(s.rate for s in trace if not s.passed)
    assert failing > 3.1 and failing / found < 1.06  # 6 geometric halvings of a 16x range
    assert note.startswith("between")


def test_more_iterations_narrow_the_bracket():
    coarse, _, _ = search_capacity(threshold_server(3.1), 0.5, 8.0, iterations=1)
    fine, _, _ = search_capacity(threshold_server(3.1), 0.5, 8.0, iterations=8)
    assert coarse <= fine <= 3.1


def test_a_server_that_fails_even_the_lowest_rate_has_no_capacity():
    found, note, trace = search_capacity(threshold_server(0.1), 0.5, 8.0, iterations=4)
    assert found is None and len(trace) == 1 and "min_rate" in note


def test_a_server_that_passes_the_highest_rate_is_censored():
    found, note, trace = search_capacity(threshold_server(100), 0.5, 8.0, iterations=4)
    assert found == 8.0 and len(trace) == 2 and "censored" in note


def sample(ttft: float, start: float, scheduled: float | None = None, error: str | None = None):
    return LoadSample(start_s=start, scheduled_s=scheduled, ttft_ms=ttft, e2e_ms=ttft + 400,
                      output_tokens=5, error=error)


def test_a_step_passes_on_goodput_and_fails_on_one_miss_in_a_hundred():
    slo = Slo(ttft_ms=100)
    good = [sample(50, float(i), float(i)) for i in range(100)]
    judged = capacity_step(2.0, good, 50.0, slo, target=0.99)
    assert judged.passed and judged.goodput == 1.0 and judged.achieved_rate == pytest.approx(2.0)
    two_misses = good[:98] + [sample(150, 98.0), sample(50, 99.0, error="HTTP 500")]
    judged = capacity_step(2.0, two_misses, 50.0, slo, target=0.99)
    assert not judged.passed and judged.goodput == pytest.approx(0.98) and judged.errors == 1
    assert not capacity_step(2.0, [], 50.0, slo, target=0.99).passed


def test_a_step_whose_arrivals_left_late_fails_even_with_good_latency():
    late = MAX_DISPATCH_LAG_MS / 1000 * 2
    samples = [sample(50, float(i) + late, float(i)) for i in range(100)]
    judged = capacity_step(2.0, samples, 50.0, Slo(ttft_ms=100), target=0.99)
    assert judged.goodput == 1.0 and not judged.passed
    assert judged.dispatch_lag_p99_ms == pytest.approx(2 * MAX_DISPATCH_LAG_MS)


def test_a_lower_end_known_to_pass_is_not_probed_again():
    asked: list[float] = []
    judge = threshold_server(3.1)

    def evaluate(rate):
        asked.append(rate)
        return judge(rate)

    found, _, trace = search_capacity(evaluate, 0.5, 8.0, iterations=2, min_passes=True)
    assert 0.5 not in asked and asked[0] == 8.0 and len(trace) == 3
    assert found == pytest.approx(2.0)


def test_an_upper_end_that_passes_doubles_up_to_the_ceiling():
    found, note, trace = search_capacity(threshold_server(3.1), 0.5, 1.0, iterations=2,
                                         min_passes=True, ceiling=8.0)
    assert [s.rate for s in trace][:3] == [1.0, 2.0, 4.0]  # then bisects between 2 and 4
    assert 2.0 <= found <= 3.1 and note.startswith("between ")
    found, note, trace = search_capacity(threshold_server(30), 0.5, 1.0, iterations=2,
                                         min_passes=True, ceiling=8.0)
    assert [s.rate for s in trace] == [1.0, 2.0, 4.0, 8.0] and found == 8.0
    assert note == "max_rate 8 req/s still meets the target (censored)"
