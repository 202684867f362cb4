"""A load level and a capacity probe say what they are doing while they run (plain lines in CI)."""

from __future__ import annotations

import pytest

from infra.progress import progress
from load.profile import LoadProfile
from load.runner import find_capacity, run_level

PROFILE = LoadProfile(
    low_users=1, high_users=2, prompt_tokens=16, output_tokens=4, requests=4, warmup_requests=0,
    request_timeout_s=10, seed=5,
    slo={"ttft_ms": 5000, "tpot_ms": 1000},
    capacity={"enabled": True, "min_rate": 2, "max_rate": 4, "iterations": 0, "duration_s": 1,
              "min_requests": 2, "warmup_s": 0, "pool_users": 4},
)


@pytest.fixture()
def lines(monkeypatch):
    written: list[str] = []
    monkeypatch.setattr(progress, "terminal", False)
    monkeypatch.setattr(progress, "write", written.append)
    return written


def test_a_level_announces_itself_and_ends_with_its_latencies(fake_openai, tmp_path, lines):
    run_level(fake_openai.base_url, "fake-model", PROFILE, "high", 2, tmp_path / "stage" / "load")
    assert lines[0] == "stage: load high, 2 user(s): 4 requests"
    assert lines[1].startswith("stage: load high, 2 user(s): 4 requests in ")
    assert "TTFT p50 " in lines[1] and "TPOT p50 " in lines[1] and lines[1].endswith("0 error(s)")


def test_each_capacity_probe_says_its_rate_and_outcome(fake_openai, tmp_path, lines):
    find_capacity(fake_openai.base_url, "fake-model", PROFILE, tmp_path / "stage" / "load")
    probes = [line for line in lines if line.startswith("stage: capacity: ")]
    assert probes[0] == "stage: capacity: probing 2 req/s for 1 s"
    assert probes[1].startswith("stage: capacity: 2 req/s meets the SLO (100% of ")
    assert probes[2] == "stage: capacity: probing 4 req/s for 1 s"


def test_a_probe_that_has_failed_stops_before_its_window_ends(fake_openai, tmp_path, lines):
    """Every request misses a 1 ms TTFT bound: the second miss decides the 2 req/s probe (the
    target allows one of ~20 arrivals in 10 s), so it stops instead of running its window."""
    fake_openai.first_token_delay_s = 0.05
    profile = PROFILE.model_copy(update={
        "slo": PROFILE.slo.model_copy(update={"ttft_ms": 1}),
        "capacity": PROFILE.capacity.model_copy(update={"duration_s": 10, "target": 0.95}),
    })
    capacity, note, trace = find_capacity(fake_openai.base_url, "fake-model", profile,
                                          tmp_path / "stage" / "load")
    assert capacity is None and note.startswith("even min_rate 2 req/s misses")
    (step,) = trace
    assert not step.passed and step.goodput == 0
    assert step.stopped_s is not None and step.stopped_s < 10
    assert 2 <= step.requests < 20
    assert "stopped after" in lines[-1]


def test_the_watch_counts_only_misses_inside_the_window():
    from load.capacity import MissWatch
    from load.results import LoadSample

    slo = PROFILE.slo
    watch = MissWatch(rate=10, window_s=10, warmup_s=1, slo=slo, target=0.99)
    assert watch.allowed == 1
    late = LoadSample(start_s=100.5, ttft_ms=9000, e2e_ms=9100, output_tokens=4)
    watch.add([LoadSample(start_s=100, ttft_ms=10, e2e_ms=20, output_tokens=4), late])
    assert watch.misses() == 0  # in the warm-up second
    watch.add([late.model_copy(update={"start_s": 102}), late.model_copy(update={"start_s": 103})])
    assert watch.misses() == 2 and watch.failed()
    watch = MissWatch(rate=10, window_s=10, warmup_s=1, slo=slo, target=0.99)
    watch.add([LoadSample(start_s=100, ttft_ms=10, e2e_ms=20, output_tokens=4),
               late.model_copy(update={"start_s": 115})])  # after the window closed
    assert not watch.failed()


def test_the_watch_fails_a_probe_once_its_lag_p99_cannot_stay_under_the_limit():
    """Requests leaving late (the client starved, the pool dry) fail a probe as surely as SLO
    misses: once enough are late that the final p99 lies above the limit, however many on-time
    requests follow (up to a quarter more arrivals than expected)."""
    import numpy as np

    from load.capacity import MAX_DISPATCH_LAG_MS, MissWatch, capacity_step
    from load.results import LoadSample

    slo = PROFILE.slo
    watch = MissWatch(rate=8, window_s=20, warmup_s=1, slo=slo, target=0.99)
    on_time = [LoadSample(start_s=100 + 2 * i, scheduled_s=100 + 2 * i - 0.001, ttft_ms=10,
                          e2e_ms=20, output_tokens=4) for i in range(10)]  # the first opens it
    lag_s = 2 * MAX_DISPATCH_LAG_MS / 1000
    late = [s.model_copy(update={"scheduled_s": s.start_s - lag_s}) for s in on_time[1:]]
    watch.add([*on_time, *late[:watch.late_allowed]])
    assert watch.misses() == 0 and not watch.failed()  # every request met the SLO
    watch.add(late[watch.late_allowed:watch.late_allowed + 1])
    assert watch.failed()
    # The judge at the end agrees for any count up to 1.25x the expected 160 arrivals.
    late_count = watch.late_allowed + 1
    for total in (late_count + 20, 160, 200):
        samples = on_time[:1] * (total - late_count) + late[:1] * late_count
        step = capacity_step(8, samples, 20, slo, 0.99)
        lags = [s.dispatch_lag_ms for s in samples]
        assert np.percentile(lags, 99) > MAX_DISPATCH_LAG_MS and not step.passed, total


def test_an_open_loop_probe_sends_nothing_after_its_window(fake_openai, tmp_path):
    """Users waiting for an arrival past the window stop: the probe does not sleep through
    Locust's stop timeout offering requests nobody judges."""
    from load.runner import run_rate

    profile = PROFILE.model_copy(update={"request_timeout_s": 60})
    samples = run_rate(fake_openai.base_url, "fake-model", profile, 2.0, tmp_path)
    starts = sorted(s.start_s for s in samples)
    search = profile.capacity
    assert len(samples) >= 2
    assert starts[-1] - starts[0] <= search.warmup_s + search.window_s(2.0) + 0.5
