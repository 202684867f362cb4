"""Plumbing of the run modes against the in-tree fake server: request budgets, Poisson arrivals,
repeats with goodput, bad engines, distributed Locust and the web UI."""

from __future__ import annotations

import socket
import threading
import urllib.request

import numpy as np
import pytest

from load.profile import CapacitySearch, LoadProfile, Slo
from load.runner import read_samples, run_level, run_load, run_rate
from load.stats import measured_window
from load.webui import WebUI
from tests import fake_openai as fake_module

PROFILE = LoadProfile(
    low_users=1, high_users=3, prompt_tokens=16, output_tokens=6, warmup_s=0.5, duration_s=2,
    request_timeout_s=10, seed=11,
)


def test_a_request_budget_sends_exactly_that_many_requests(fake_openai, tmp_path):
    profile = PROFILE.model_copy(update={"duration_s": None, "requests": 13, "warmup_requests": 3})
    samples = run_level(fake_openai.base_url, "fake-model", profile, "high", 3, tmp_path)
    assert len(samples) == len(fake_openai.requests) == 16
    assert all(s.error is None and s.end_s > s.start_s for s in samples)
    result = run_load(fake_openai.base_url, "fake-model", profile, tmp_path / "all")
    for level in ("low", "high"):
        summary = result.summaries[level]
        assert summary.requests == 13  # the 3 warm-up requests are not counted
        assert summary.output_tokens_per_s == pytest.approx(summary.requests_per_s * 6)


def test_poisson_arrivals_do_not_wait_for_a_slow_server(fake_openai, tmp_path):
    # Each answer takes ~0.5 s; a closed loop of 1 user could start at most ~2 per second.
    fake_openai.first_token_delay_s = 0.5
    rate = 25.0
    profile = PROFILE.model_copy(update={
        "capacity": CapacitySearch(pool_users=40, warmup_s=0.0, duration_s=3.0),
    })
    samples = run_rate(fake_openai.base_url, "fake-model", profile, rate, tmp_path)
    assert all(s.scheduled_s is not None for s in samples)
    scheduled = np.sort([s.scheduled_s for s in samples])
    gaps = np.diff(scheduled)
    # Exponential gaps: mean 1/rate and coefficient of variation 1 (a fixed pace would give 0).
    assert len(samples) > 40
    assert np.mean(gaps) == pytest.approx(1 / rate, rel=0.35)
    assert 0.7 < np.std(gaps) / np.mean(gaps) < 1.3
    # Arrivals left on schedule although every answer was slow: open loop, pool not exhausted.
    lags = [s.dispatch_lag_ms for s in samples]
    assert np.percentile(lags, 90) < 50
    assert max(s.e2e_ms for s in samples if s.e2e_ms) > 500


def test_a_low_rate_runs_long_enough_to_expect_min_requests(fake_openai, tmp_path):
    search = CapacitySearch(warmup_s=0.0, duration_s=1.0, min_requests=5, pool_users=4)
    assert (search.window_s(2.0), search.window_s(20.0)) == (2.5, 1.0)
    profile = PROFILE.model_copy(update={"capacity": search})
    samples = run_rate(fake_openai.base_url, "fake-model", profile, 2.0, tmp_path)
    scheduled = sorted(s.scheduled_s for s in samples)
    # The first arrival opens the schedule (as in vllm bench serve) and arrivals go on past
    # duration_s, into the longer window that low rates get.
    assert scheduled[-1] - scheduled[0] > 1.0
    assert len(measured_window(samples, 0.0, search.window_s(2.0))) >= 3


def test_repeats_give_intervals_and_an_slo_gives_goodput(fake_openai, tmp_path):
    fake_openai.error_fraction = 0.1
    fake_openai.token_delay_s = 0.01
    loose = PROFILE.model_copy(update={"repeats": 2, "slo": Slo(ttft_ms=5000, tpot_ms=5000)})
    result = run_load(fake_openai.base_url, "fake-model", loose, tmp_path / "loose")
    for level in ("low", "high"):
        summary = result.summaries[level]
        assert summary.repeats == 2 and len(result.repeat_summaries[level]) == 2
        assert summary.requests == sum(r.requests for r in result.repeat_summaries[level])
        # Everything that succeeded meets a loose SLO: goodput is the success rate.
        assert summary.goodput == pytest.approx(1 - summary.error_rate)
        low, high = summary.tpot_p50_ci_ms
        assert low <= summary.tpot_p50_ms <= high or high - low < 1.0
        assert summary.requests_per_s_ci is not None
    assert {s.repeat for s in result.samples["high"]} == {0, 1}
    # One Locust HTML report per level (about 1 MB each, logged to MLflow): the repeats keep
    # their CSVs and raw samples.
    assert (tmp_path / "loose" / "locust_high.html").stat().st_size > 0
    assert (tmp_path / "loose" / "locust_high-r2_stats.csv").stat().st_size > 0
    assert not (tmp_path / "loose" / "locust_high-r2.html").exists()
    # The fake decodes a token every 10 ms: a 5 ms TPOT bound is met only when a stalled client
    # read several tokens at once (this box is shared), never by most requests.
    tight = PROFILE.model_copy(update={"slo": Slo(tpot_ms=5), "high_users": 1})
    result = run_load(fake_openai.base_url, "fake-model", tight, tmp_path / "tight")
    assert result.summaries["low"].goodput < 0.3


def test_an_engine_that_dies_mid_run_is_counted_and_fails_the_limit(fake_openai, tmp_path, monkeypatch):
    fake_openai.token_delay_s = 0.02
    died = threading.Event()
    original = fake_module._Handler._event

    def cut_when_dead(handler, payload):
        # The engine dies while streaming the 3rd token of its 6th answer: the streams in flight
        # are cut, and the port refuses every later connection.
        if getattr(handler, "answering", None) is not handler.headers:  # a new request
            handler.answering, handler.events_sent = handler.headers, 0
        handler.events_sent += 1
        if len(fake_openai.requests) >= 6 and handler.events_sent > 2 and not died.is_set():
            died.set()
            threading.Thread(target=fake_openai.stop).start()
        if died.is_set():
            handler.connection.shutdown(socket.SHUT_RDWR)
            raise ConnectionAbortedError("engine died")
        original(handler, payload)

    monkeypatch.setattr(fake_module._Handler, "_event", cut_when_dead)
    profile = PROFILE.model_copy(update={"low_users": 2, "high_users": 2, "warmup_s": 0})
    result = run_load(fake_openai.base_url, "fake-model", profile, tmp_path)
    low = result.summaries["low"]
    failed = [s for s in result.samples["low"] if s.error]
    assert low.requests > low.errors > 0
    assert any(s.ttft_ms is not None for s in failed)  # answers cut after their first tokens
    assert any("Connection" in s.error for s in failed)  # then refused connections
    assert result.summaries["high"].error_rate == 1.0
    assert result.max_error_rate == 0.01  # the gate judges the counts (gates/latency.py)


def test_an_engine_that_hangs_is_timed_out_per_request(fake_openai, tmp_path):
    fake_openai.first_token_delay_s = 3.0
    profile = PROFILE.model_copy(update={"request_timeout_s": 0.5, "warmup_s": 0, "duration_s": 1})
    samples = run_level(fake_openai.base_url, "fake-model", profile, "low", 1, tmp_path)
    assert samples and all(s.error and "Timeout" in s.error for s in samples)


def test_distributed_mode_merges_samples_from_two_workers(fake_openai, tmp_path):
    profile = PROFILE.model_copy(update={"workers": 2, "low_users": 2, "high_users": 4})
    result = run_load(fake_openai.base_url, "fake-model", profile, tmp_path)
    raw = read_samples(tmp_path / "samples_low.jsonl") + read_samples(tmp_path / "samples_high.jsonl")
    assert len(raw) == len(fake_openai.requests) > 0
    assert {s.worker for s in raw} == {"worker-0", "worker-1"}
    for level in ("low", "high"):
        assert {s.worker for s in result.samples[level]} == {"worker-0", "worker-1"}
    # Workers seed prompts apart: no prompt was sent twice.
    assert len({tuple(b["prompt"]) for b in fake_openai.requests}) == len(fake_openai.requests)
    for name in ("locust_high.html", "locust_high_worker0.log", "locust_high_worker1.log"):
        assert (tmp_path / name).stat().st_size > 0


def test_the_web_ui_serves_on_localhost_and_stops(fake_openai, tmp_path):
    profile = tmp_path / "p.yaml"
    profile.write_text(PROFILE.model_dump_json())
    with WebUI(fake_openai.base_url, "fake-model", profile, tmp_path, level="high") as ui:
        assert ui.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(ui.url, timeout=5) as page:
            assert page.status == 200 and b"ocust" in page.read()
        process = ui.process
    assert process.poll() is not None
    assert fake_openai.requests == []  # a UI alone sends nothing until someone presses Start
