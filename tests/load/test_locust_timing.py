"""How the locustfile times a stream (vLLM's definitions) and starts a closed loop, on the fake server."""

from __future__ import annotations

import pytest

from load.profile import LoadProfile
from load.runner import run_level

PROFILE = LoadProfile(
    low_users=1, high_users=3, prompt_tokens=16, output_tokens=5, requests=9, warmup_requests=0,
    request_timeout_s=10, seed=5,
)


@pytest.mark.parametrize("include_usage", [True, False])
def test_vllm_style_compact_chunks_count_tokens_not_the_usage_chunk(fake_openai, tmp_path,
                                                                   include_usage):
    # vLLM writes compact JSON: its final usage chunk has "choices":[] and is not a token. A token
    # whose text spells the same characters is still a token (inside a string they are escaped).
    fake_openai.compact_json = True
    fake_openai.include_usage = include_usage
    fake_openai.token_text = '"choices":[]'
    samples = run_level(fake_openai.base_url, "fake-model", PROFILE, "low", 1, tmp_path)
    assert len(samples) == 9 and all(s.error is None for s in samples)
    assert {s.output_tokens for s in samples} == {5}
    assert {len(s.itl_ms) for s in samples} == {4}


def test_ttft_itl_and_the_end_follow_vllm_bench_definitions(fake_openai, tmp_path):
    fake_openai.first_token_delay_s = 0.03
    fake_openai.token_delay_s = 0.01
    samples = run_level(fake_openai.base_url, "fake-model", PROFILE, "low", 1, tmp_path)
    # Bounds from below and relations only: a shared box stretches every figure (no wall-clock
    # ceiling), but cannot make a sleep shorter or a gap land outside the request.
    for sample in samples:
        # TTFT: from before the request is sent to the first token (30 ms + one 10 ms step).
        assert 38 <= sample.ttft_ms < sample.e2e_ms
        # Four gaps between consecutive token chunks. A late wake-up on a shared machine delays
        # one chunk's read, lengthening its gap and shortening the next (or TTFT's, for the first
        # chunk): the bound from below is on when the last token arrives, 30 ms + five 10 ms steps.
        assert len(sample.itl_ms) == 4 and all(gap >= 0 for gap in sample.itl_ms)
        last_token_ms = sample.ttft_ms + sum(sample.itl_ms)
        assert last_token_ms >= 78
        # The end is the [DONE] line right after the last token, sooner than a token step:
        # TPOT is the time per token after the first.
        assert 0 <= sample.e2e_ms - last_token_ms < max(sample.itl_ms)
        assert sample.tpot_ms == pytest.approx((sample.e2e_ms - sample.ttft_ms) / 4)


def test_closed_loop_users_send_their_first_requests_together(fake_openai, tmp_path):
    # Locust spawns the 3 users a third of a second apart; like `vllm bench serve`'s requests
    # under --max-concurrency they must still start together, or the loop stays staggered.
    fake_openai.first_token_delay_s = 0.05
    samples = run_level(fake_openai.base_url, "fake-model", PROFILE, "high", 3, tmp_path)
    first_three = sorted(s.start_s for s in samples)[:3]
    assert first_three[-1] - first_three[0] < 0.1


@pytest.mark.parametrize("end_with, error", [
    ("cut", "stream cut after 2 tokens (no [DONE])"),
    ("error", "stream error: {'message': 'injected mid-stream failure'}"),
])
def test_a_stream_that_ends_early_is_a_failed_request(fake_openai, tmp_path, end_with, error):
    fake_openai.end_after_tokens, fake_openai.end_with = 2, end_with
    samples = run_level(fake_openai.base_url, "fake-model", PROFILE, "low", 1, tmp_path)
    assert len(samples) == 9 and {s.error for s in samples} == {error}


def test_lines_received_in_pieces_are_read_whole_and_timed_when_complete(fake_openai, tmp_path):
    # Each event arrives in two receives 3 ms apart: a token counts once, at its second half.
    fake_openai.split_events = True
    fake_openai.token_delay_s = 0.01
    samples = run_level(fake_openai.base_url, "fake-model", PROFILE, "low", 1, tmp_path)
    assert all(s.error is None for s in samples) and {s.output_tokens for s in samples} == {5}
    assert {len(s.itl_ms) for s in samples} == {4}
    assert all(13 <= s.ttft_ms < 150 for s in samples)  # 10 ms step + 3 ms until the line ends
