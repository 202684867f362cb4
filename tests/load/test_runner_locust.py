"""Plumbing: the real Locust subprocess against the in-tree fake OpenAI server."""

from __future__ import annotations

import json

import pytest

from infra.errors import MeasurementError
from load.profile import LoadProfile
from load.results import LoadResult
from load.runner import read_samples, run_level, run_load

PROFILE = LoadProfile(
    low_users=1,
    high_users=3,
    prompt_tokens=24,
    output_tokens=8,
    warmup_s=1,
    duration_s=3,
    request_timeout_s=10,
    seed=7,
)


def test_run_load_measures_the_fake_servers_timing(fake_openai, tmp_path):
    fake_openai.first_token_delay_s = 0.03
    fake_openai.token_delay_s = 0.01
    fake_openai.error_fraction = 0.1

    result = run_load(fake_openai.base_url, fake_openai.model, PROFILE, tmp_path)

    # Every request the server saw has the fixed shape that makes stages comparable.
    assert fake_openai.requests
    for body in fake_openai.requests:
        assert len(body["prompt"]) == 24
        assert all(isinstance(t, int) and 1000 <= t <= 40000 for t in body["prompt"])
        assert body["max_tokens"] == 8 and body["ignore_eos"] is True
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["model"] == "fake-model" and body["temperature"] == 0
    # Seeded prompts differ from request to request (no accidental prefix-cache hits).
    assert len({tuple(b["prompt"]) for b in fake_openai.requests}) == len(fake_openai.requests)

    # Every request the server answered was recorded once (in-flight ones finish, not vanish).
    raw = read_samples(tmp_path / "samples_low.jsonl") + read_samples(tmp_path / "samples_high.jsonl")
    assert len(raw) == len(fake_openai.requests)
    assert sum(s.error is not None for s in raw) == fake_openai.errors_sent > 0
    assert all(s.error.startswith("HTTP 500") for s in raw if s.error)

    for level, users in (("low", 1), ("high", 3)):
        summary = result.summaries[level]
        samples = result.samples[level]
        assert summary.users == users and summary.duration_s == 3
        assert summary.requests == len(samples) < len(read_samples(tmp_path / f"samples_{level}.jsonl"))
        assert 0 < summary.errors < summary.requests
        assert summary.error_rate == pytest.approx(summary.errors / summary.requests)
        for sample in samples:
            if sample.error is None:
                assert sample.output_tokens == 8 and len(sample.itl_ms) == 7
        # The fake answers its first token after 30 + 10 ms, then one every 10 ms.
        assert 40 <= summary.ttft_p50_ms < 400
        assert 9 <= summary.tpot_p50_ms < 100
        assert 9 <= summary.itl_p50_ms < 100
        assert 110 <= summary.e2e_p50_ms < 1000
        assert summary.output_tokens_per_s == pytest.approx(summary.requests_per_s * 8)
    # A closed loop: one user cannot exceed 1 / e2e requests per second; three do more than one.
    low, high = result.summaries["low"], result.summaries["high"]
    assert low.requests_per_s <= 1000 / low.e2e_p50_ms * 1.2
    assert high.requests_per_s > low.requests_per_s * 1.5

    # Artifacts a flow can log, and a result that reads back unchanged.
    for name in ("locust_low.html", "locust_high.html", "locust_low_stats.csv", "locust_high.log"):
        assert (tmp_path / name).stat().st_size > 0
    assert LoadResult.read(tmp_path) == result
    json.loads((tmp_path / "load.json").read_text())


def test_token_count_falls_back_to_chunks_without_usage(fake_openai, tmp_path):
    fake_openai.include_usage = False
    profile = PROFILE.model_copy(update={"output_tokens": 5, "warmup_s": 0, "duration_s": 1})
    samples = run_level(fake_openai.base_url, "fake-model", profile, "low", 2, tmp_path)
    assert samples and all(s.error is None for s in samples)
    assert {s.output_tokens for s in samples} == {5}
    assert {len(s.itl_ms) for s in samples} == {4}


def test_a_locust_that_cannot_start_raises_with_its_log(fake_openai, tmp_path):
    with pytest.raises(MeasurementError, match=r"(?s)exited with 1.*QG_MODEL"):
        run_level(fake_openai.base_url, "", PROFILE, "low", 1, tmp_path)


def test_a_dead_server_is_all_errors_not_a_pass(tmp_path):
    profile = PROFILE.model_copy(update={"warmup_s": 0, "duration_s": 1})
    samples = run_level("http://127.0.0.1:9", "m", profile, "low", 1, tmp_path)
    assert samples and all(s.error and "Connection" in s.error for s in samples)


def test_a_window_that_sees_no_request_start_fails_closed(fake_openai, tmp_path):
    # Each request takes ~1.5 s, so a single user starts none inside a 0.5 s window after 1 s.
    fake_openai.first_token_delay_s = 1.5
    profile = PROFILE.model_copy(update={"high_users": 1, "warmup_s": 1, "duration_s": 0.5})
    with pytest.raises(MeasurementError, match=r"low: none of \d+ requests started inside"):
        run_load(fake_openai.base_url, "fake-model", profile, tmp_path)
