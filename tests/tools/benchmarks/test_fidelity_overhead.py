"""The two load benchmarks on fake servers: overhead (Locust vs a minimal client) and fidelity."""

from __future__ import annotations

import numpy as np
import pytest

from infra.cores import CorePlan
from load.profile import LoadProfile
from tools.benchmarks import fidelity as benchmark_fidelity
from tools.benchmarks import overhead as benchmark_overhead


def test_added_latency_pairs_requests_in_start_order_and_drops_the_warmup():
    seen = [(10.0, 5.0, 2.0), (11.0, 7.0, 3.0), (12.0, 9.0, 4.0)]  # start, TTFT, TPOT
    # received, first token written, last token written, tokens (server clock, seconds)
    served = [[12.0, 12.008, 12.011, 4], [10.0, 10.004, 10.007, 4], [11.0, 11.006, 11.009, 4]]
    added = benchmark_overhead.added_latency(seen, served, warmup=1)
    assert added["ttft"] == pytest.approx([1.0, 1.0])
    assert added["tpot"] == pytest.approx([2.0, 3.0])
    with pytest.raises(RuntimeError, match="client saw 3 requests, the server 2"):
        benchmark_overhead.added_latency(seen, served[:2], warmup=0)


def test_overhead_benchmark_measures_locust_and_the_reference_on_one_server(tmp_path, capsys):
    rows = benchmark_overhead.measure([2], requests=20, rounds=2, prompt_tokens=16,
                                      output_tokens=6, out=tmp_path)
    (row,) = rows
    assert row["concurrency"] == 2 and row["requests_per_side"] == 40
    for metric in ("ttft", "tpot"):
        figures = row[metric]
        # Loose bounds: the machine is shared. The real figures come from the CLI's table.
        assert 0 <= figures["reference_p50_ms"] < 5
        assert -0.5 < figures["locust_p50_ms"] < 5
        assert figures["locust_p50_ms"] <= figures["locust_p99_ms"]
    benchmark_overhead.print_table(rows)
    assert "Added latency" in capsys.readouterr().out


def test_fidelity_warms_up_alternates_pairs_rounds_and_never_replays_prompts(
        fake_openai, tmp_path, monkeypatch, capsys):
    calls = []

    plan = CorePlan.unplanned()

    def vllm_side(base_url, model, tokenizer, profile, users, out, cores=None):
        # Stands in for `vllm bench serve`: the same work through quantgate's own client.
        assert cores is plan  # both clients run on the cores the plan gives them
        calls.append((profile.seed, profile.requests, profile.warmup_requests))
        return benchmark_fidelity.quantgate_side(base_url, model, profile, users, out, cores)

    monkeypatch.setattr(benchmark_fidelity, "vllm_side", vllm_side)
    profile = LoadProfile(low_users=2, high_users=2, prompt_tokens=16, output_tokens=4,
                          requests=1, warmup_requests=1, request_timeout_s=10, seed=3)
    rows = benchmark_fidelity.compare(fake_openai.base_url, "fake-model", "tok", profile, [2],
                                      tmp_path, rounds=3, requests_per_user=3, warmup_per_user=1,
                                      cores=plan)
    (row,) = rows
    assert row["order"] == ["quantgate", "vllm", "vllm", "quantgate", "quantgate", "vllm"]
    assert (tmp_path / "c2-warmup" / "samples_c2.jsonl").exists()
    # Whole closed-loop rounds: 3 measured and 1 warm-up request per user, every run its own seed.
    assert [c[1:] for c in calls] == [(6, 2)] * 3 and len({c[0] for c in calls}) == 3
    assert all(run["requests"] == 6 for side in row["runs"].values() for run in side)
    # Warm-up run (6) + six runs of 8: every prompt the server saw was new to it.
    prompts = [tuple(body["prompt"]) for body in fake_openai.requests]
    assert len(prompts) == 6 + 6 * 8 == len(set(prompts))
    # One ratio per round (each run against its neighbour), summarised by their median.
    assert len(row["round_ratios"]) == 3
    ttft = [r["median_ttft_ms"] for r in row["round_ratios"]]
    assert row["ratio"]["median_ttft_ms"] == pytest.approx(float(np.median(ttft)))
    assert row["quantgate"]["median_done_gap_ms"] < 5
    assert isinstance(row["within_goal"], bool)
    benchmark_fidelity.print_table(rows)
    assert "TTFT ratio per round" in capsys.readouterr().out
