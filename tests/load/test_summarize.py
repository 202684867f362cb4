"""Latency and rate figures computed from hand-made raw samples with known answers."""

from __future__ import annotations

import pytest

from infra.errors import MeasurementError
from load.results import LoadSample
from load.runner import check_equal_work, measured_window, read_samples, summarize


def ok(ttft: float, e2e: float, tokens: int = 5, start: float = 0.0, itl=None) -> LoadSample:
    return LoadSample(start_s=start, ttft_ms=ttft, e2e_ms=e2e, output_tokens=tokens, itl_ms=itl or [])


def failed(start: float = 0.0) -> LoadSample:
    return LoadSample(start_s=start, ttft_ms=9999.0, error="HTTP 500: boom")


def test_percentiles_match_linear_interpolation():
    samples = [ok(ttft=float(v), e2e=float(v) + 400) for v in range(1, 101)]
    summary = summarize(samples, "low", 1, window_s=10.0)
    assert summary.ttft_p50_ms == pytest.approx(50.5)
    assert summary.ttft_p90_ms == pytest.approx(90.1)
    assert summary.ttft_p99_ms == pytest.approx(99.01)
    assert summary.e2e_p50_ms == pytest.approx(450.5)


def test_tpot_is_decode_time_per_token_after_the_first():
    # (400 - 100) / (4 - 1) = 100 ms; (260 - 20) / (5 - 1) = 60 ms
    samples = [ok(ttft=100, e2e=400, tokens=4), ok(ttft=20, e2e=260, tokens=5)]
    summary = summarize(samples, "low", 1, window_s=1.0)
    assert summary.tpot_p50_ms == pytest.approx(80.0)
    assert summary.tpot_p99_ms == pytest.approx(60 + 0.99 * 40)


def test_single_token_requests_have_no_tpot():
    summary = summarize([ok(ttft=10, e2e=10, tokens=1)], "low", 1, window_s=1.0)
    assert summary.tpot_p50_ms is None
    assert summary.ttft_p50_ms == pytest.approx(10.0)


def test_itl_pools_every_gap_of_every_request():
    samples = [ok(10, 20, itl=[1.0, 2.0, 3.0]), ok(10, 20, itl=[4.0, 5.0]), ok(10, 20, itl=[])]
    summary = summarize(samples, "high", 2, window_s=1.0)
    assert summary.itl_p50_ms == pytest.approx(3.0)
    assert summary.itl_p90_ms == pytest.approx(4.6)


def test_errors_are_counted_and_kept_out_of_latency_and_throughput():
    samples = [ok(ttft=10, e2e=50, tokens=8) for _ in range(8)] + [failed(), failed()]
    summary = summarize(samples, "high", 4, window_s=4.0)
    assert (summary.requests, summary.errors) == (10, 2)
    assert summary.error_rate == pytest.approx(0.2)
    assert summary.ttft_p99_ms == pytest.approx(10.0)  # the failures' 9999 ms is not latency
    assert summary.requests_per_s == pytest.approx(8 / 4.0)
    assert summary.output_tokens_per_s == pytest.approx(8 * 8 / 4.0)
    assert (summary.level, summary.users, summary.duration_s) == ("high", 4, 4.0)


def test_all_failed_gives_no_latency_and_full_error_rate():
    summary = summarize([failed(), failed()], "low", 1, window_s=2.0)
    assert summary.error_rate == 1.0
    assert summary.requests_per_s == 0.0
    assert summary.ttft_p50_ms is None and summary.e2e_p99_ms is None


def test_empty_window_and_bad_window():
    summary = summarize([], "low", 1, window_s=1.0)
    assert (summary.requests, summary.error_rate, summary.ttft_p50_ms) == (0, 0.0, None)
    with pytest.raises(ValueError, match="window_s"):
        summarize([], "low", 1, window_s=0)


def test_warmup_requests_and_late_starters_are_dropped():
    samples = [ok(10, 20, start=1000.0 + t) for t in (0.0, 1.0, 1.99, 2.0, 4.5, 6.99, 7.0, 8.0)]
    kept = measured_window(samples, warmup_s=2.0, duration_s=5.0)
    assert [s.start_s - 1000.0 for s in kept] == pytest.approx([2.0, 4.5, 6.99])
    assert measured_window([], warmup_s=2.0, duration_s=5.0) == []


def test_short_outputs_are_refused_because_work_would_differ():
    check_equal_work([ok(1, 2, tokens=8), failed()], output_tokens=8, level="low")
    with pytest.raises(MeasurementError, match=r"low: 1 requests returned \[3\] output tokens"):
        check_equal_work([ok(1, 2, tokens=8), ok(1, 2, tokens=3)], output_tokens=8, level="low")


def test_read_samples_parses_json_lines(tmp_path):
    path = tmp_path / "samples.jsonl"
    lines = [ok(1.5, 9.0, tokens=3, itl=[2.0, 3.0]).model_dump_json(), "", failed().model_dump_json()]
    path.write_text("\n".join(lines) + "\n")
    samples = read_samples(path)
    assert [s.error for s in samples] == [None, "HTTP 500: boom"]
    assert samples[0].itl_ms == [2.0, 3.0] and samples[0].tpot_ms == pytest.approx(3.75)
    assert read_samples(tmp_path / "missing.jsonl") == []
