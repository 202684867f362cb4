"""Goodput, request-count windows and intervals across repeats, on hand-made samples."""

from __future__ import annotations

import pytest
from scipy import stats

from load.profile import Slo
from load.results import LoadSample, ci_field
from load.stats import busy_span_s, goodput, measured_count, meets_slo, pool_repeats, t_interval


def ok(ttft: float, e2e: float, tokens: int = 5, start: float = 0.0) -> LoadSample:
    return LoadSample(start_s=start, ttft_ms=ttft, e2e_ms=e2e, output_tokens=tokens,
                      end_s=start + e2e / 1000)


def failed(start: float = 0.0) -> LoadSample:
    return LoadSample(start_s=start, ttft_ms=5.0, error="HTTP 500: boom", end_s=start + 0.01)


def test_a_request_meets_the_slo_only_when_every_set_bound_holds():
    # TPOT = (e2e - ttft) / (tokens - 1): (500 - 100) / 4 = 100 ms
    sample = ok(ttft=100, e2e=500, tokens=5)
    assert meets_slo(sample, Slo(ttft_ms=100, tpot_ms=100))
    assert not meets_slo(sample, Slo(ttft_ms=99.9, tpot_ms=100))
    assert not meets_slo(sample, Slo(ttft_ms=100, tpot_ms=99.9))
    assert meets_slo(sample, Slo(ttft_ms=100))  # no TPOT bound: TPOT does not matter
    assert not meets_slo(failed(), Slo(ttft_ms=1000))  # a fast failure is not good service
    assert not meets_slo(ok(ttft=10, e2e=10, tokens=1), Slo(tpot_ms=50))  # no TPOT to judge


def test_goodput_counts_failures_in_the_denominator():
    samples = [ok(100, 500)] * 6 + [ok(300, 700)] * 2 + [failed()] * 2
    assert goodput(samples, Slo(ttft_ms=200)) == pytest.approx(0.6)
    assert goodput(samples, Slo(ttft_ms=1000)) == pytest.approx(0.8)
    assert goodput([], Slo(ttft_ms=1)) is None


def test_request_count_runs_drop_the_first_starters_and_span_to_the_last_end():
    samples = [ok(10, 1000, start=s) for s in (3.0, 0.0, 2.0, 1.0)]
    kept = measured_count(samples, warmup_requests=2)
    assert [s.start_s for s in kept] == [2.0, 3.0]
    assert busy_span_s(kept) == pytest.approx(2.0)  # 2.0 -> 3.0 + 1 s
    assert busy_span_s([]) == 0.0


def test_t_interval_matches_scipy_and_needs_two_points():
    values = [10.0, 12.0, 11.0, 13.0]
    low, high = t_interval(values)
    expected = stats.t.interval(0.95, 3, loc=11.5, scale=stats.sem(values))
    assert (low, high) == pytest.approx(expected)
    assert t_interval([5.0]) is None and t_interval([None, 5.0]) is None
    assert t_interval([4.0, 4.0]) == (4.0, 4.0)


def test_repeats_pool_raw_samples_and_give_intervals():
    first = [ok(100, 500, start=float(i)) for i in range(10)]
    second = [ok(200, 600, start=float(i)) for i in range(10)] + [failed()] * 10
    pooled, each = pool_repeats([first, second], [10.0, 10.0], "low", 1, Slo(ttft_ms=150))
    assert [s.ttft_p50_ms for s in each] == pytest.approx([100.0, 200.0])
    assert [s.goodput for s in each] == pytest.approx([1.0, 0.0])
    # Pooled figures come from all 30 raw samples, not from averaging the repeats' figures.
    assert (pooled.requests, pooled.errors, pooled.repeats) == (30, 10, 2)
    assert pooled.ttft_p50_ms == pytest.approx(150.0)
    assert pooled.requests_per_s == pytest.approx(20 / 20.0)
    assert pooled.goodput == pytest.approx(10 / 30)
    assert pooled.goodput_requests_per_s == pytest.approx(10 / 20.0)
    low, high = pooled.ttft_p50_ci_ms
    assert low < 150.0 < high and high - low > 100.0  # two very different repeats: wide
    assert pooled.requests_per_s_ci == (1.0, 1.0)
    single, _ = pool_repeats([first], [10.0], "low", 1)
    assert single.ttft_p50_ci_ms is None and single.goodput is None


def test_every_interval_field_exists_on_the_summary():
    from load.results import CI_FIGURES, LoadSummary

    for figure in CI_FIGURES:
        assert figure in LoadSummary.model_fields
        assert ci_field(figure) in LoadSummary.model_fields
