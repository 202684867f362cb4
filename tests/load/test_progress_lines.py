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
