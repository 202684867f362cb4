"""Interleaved rounds: the real Locust runner against two in-tree fake servers, and the ratios."""

from __future__ import annotations

import math

import pytest

from infra.cores import plan_cores
from load.paired import Server, round_order, run_paired_load
from load.profile import LoadProfile
from load.results import LoadResult, LoadSample, PairedLoad, PairedRound, median_ms
from tests.fake_openai import FakeOpenAI

PROFILE = LoadProfile(
    low_users=1, high_users=2, prompt_tokens=16, output_tokens=6, requests=4, warmup_requests=1,
    rounds=3, round_requests=3, round_warmup_requests=1, request_timeout_s=10, seed=5,
)


def sample(tpot: float, ttft: float = 50.0, error: str | None = None) -> LoadSample:
    return LoadSample(start_s=1.0, ttft_ms=ttft, e2e_ms=ttft + 5 * tpot, output_tokens=6,
                      error=error)


def test_rounds_alternate_which_side_goes_first():
    assert [round_order(i) for i in range(4)] == [
        ("reference", "stage"), ("stage", "reference"),
        ("reference", "stage"), ("stage", "reference"),
    ]


def test_a_round_ratio_is_of_medians_and_skips_failed_requests():
    row = PairedRound(index=0, first="reference",
                      reference=[sample(10), sample(20), sample(30), sample(1, error="HTTP 500")],
                      stage=[sample(22), sample(24), sample(26)])
    assert median_ms(row.reference, "tpot") == 20
    assert row.log_ratio("tpot") == pytest.approx(math.log(24 / 20))
    assert row.log_ratio("ttft") == pytest.approx(0.0)
    dead = row.model_copy(update={"stage": [sample(5, error="timeout")]})
    assert dead.log_ratio("tpot") is None
    paired = PairedLoad(reference="baseline", requests_per_round=3, rounds={"low": [row, dead]})
    assert paired.log_ratios("low", "tpot") == [pytest.approx(math.log(1.2))]


def test_two_servers_are_timed_in_interleaved_rounds(tmp_path):
    # The stage streams its tokens twice as slowly as the reference: every round says so.
    with FakeOpenAI(token_delay_s=0.03, first_token_delay_s=0.01) as reference, \
            FakeOpenAI(model="stage-model", token_delay_s=0.06, first_token_delay_s=0.01) as stage:
        result, paired = run_paired_load(
            Server(stage.base_url, "stage-model"), Server(reference.base_url, "fake-model"),
            "baseline", PROFILE, tmp_path, reference_command="vllm serve base",
            cores=plan_cores("cpu", usable=[0, 1]),
        )
        # Both warmed once at the busiest level (2 requests per user), then per level, round and
        # side: 1 warm-up + 3 measured requests, nothing else.
        warm = 2 * PROFILE.high_users
        assert len(reference.requests) == len(stage.requests) == warm + 2 * 3 * 4
    assert paired.reference == "baseline" and paired.requests_per_round == 3
    assert paired.reference_command == "vllm serve base"
    for level, users in (("low", 1), ("high", 2)):
        rounds = paired.rounds[level]
        assert [r.index for r in rounds] == [0, 1, 2]
        assert [r.first for r in rounds] == ["reference", "stage", "reference"]
        for row in rounds:
            assert len(row.reference) == len(row.stage) == 3
            assert all(s.error is None and s.output_tokens == 6 for s in row.reference + row.stage)
            assert {s.repeat for s in row.reference + row.stage} == {row.index}
            # The side that went first finished before the other started.
            first, second = (row.reference, row.stage) if row.first == "reference" else (
                row.stage, row.reference)
            assert max(s.end_s for s in first) <= min(s.start_s for s in second)
        ratios = paired.log_ratios(level, "tpot")
        assert len(ratios) == 3 and all(0.5 < r < 0.9 for r in ratios), ratios  # ~log 2
        # The stage's own result: its rounds pooled, one summary per round.
        summary = result.summaries[level]
        assert summary.users == users and summary.requests == 9 and summary.repeats == 3
        assert len(result.repeat_summaries[level]) == 3 and len(result.samples[level]) == 9
        assert 50 < summary.tpot_p50_ms < 150
    # Both sides' raw files, under one tag per round (same prompts on both sides).
    for side in ("reference", "stage"):
        for tag in ("low", "low-r2", "low-r3", "high", "high-r2", "high-r3"):
            assert (tmp_path / side / f"samples_{tag}.jsonl").stat().st_size > 0
    assert LoadResult.read(tmp_path) == result and PairedLoad.read(tmp_path) == paired
    # Where Locust ran against the engines is stored with the stage's result.
    assert result.cores_shared and result.client_cores == result.engine_cores == "0-1"


def test_the_stage_capacity_search_starts_from_its_pooled_levels(tmp_path, monkeypatch):
    from load import paired as paired_module

    asked = {}

    def find_capacity(base_url, model, profile, out_dir, cores, levels=None, request_body=None):
        asked.update(levels=levels, out_dir=out_dir)
        return 2.0, "between", []

    monkeypatch.setattr(paired_module, "find_capacity", find_capacity)
    profile = LoadProfile.model_validate(PROFILE.model_dump() | {
        "slo": {"ttft_ms": 5000, "tpot_ms": 1000},
        "capacity": {"enabled": True, "min_rate": 0.1, "max_rate": 8}})
    with FakeOpenAI() as reference, FakeOpenAI(model="stage-model") as stage:
        result, _ = run_paired_load(Server(stage.base_url, "stage-model"),
                                    Server(reference.base_url, "fake-model"), "baseline", profile,
                                    tmp_path / "w8" / "load")
    assert asked["levels"] == result.summaries and set(asked["levels"]) == {"low", "high"}
    assert asked["out_dir"] == tmp_path / "w8" / "load" / "stage"
    assert result.capacity_rps == 2.0 and result.capacity_s is not None


def test_progress_lines_name_the_stage_and_the_side():
    from pathlib import Path

    from load.runner import who

    assert who(Path("runs/r/w8/load")) == "w8"
    assert who(Path("runs/r/w8/load/reference")) == "w8 (reference)"


def test_a_kept_reference_never_sees_a_prompt_twice_and_both_sides_stay_alike(tmp_path):
    """A reference the run kept up has answered its own levels; a stage raced against it salts
    the rounds' prompt streams with its name, so the reference's prefix cache never hits, while
    both sides of every round still get the same prompts."""
    from load.runner import run_level

    def prompts(server, start=0):
        return [tuple(body["prompt"]) for body in server.requests[start:]]

    with FakeOpenAI(token_delay_s=0.005, first_token_delay_s=0.005) as reference, \
            FakeOpenAI(model="stage-model", token_delay_s=0.005, first_token_delay_s=0.005) as stage:
        for level, users in PROFILE.levels().items():  # the reference's own stage, unsalted
            run_level(reference.base_url, "fake-model", PROFILE, level, users, tmp_path / "own")
        own = prompts(reference)
        run_paired_load(Server(stage.base_url, "stage-model"),
                        Server(reference.base_url, "fake-model"), "baseline", PROFILE,
                        tmp_path / "a8", salt="a8")
        raced = prompts(reference, len(own))
        assert not set(own) & set(raced)
        assert sorted(raced) == sorted(prompts(stage))  # the same prompts, side for side


def test_an_unresolved_level_gets_more_rounds_while_asked(tmp_path):
    asked = []

    def more(paired: PairedLoad, level: str) -> bool:
        asked.append((level, len(paired.rounds[level])))
        return level == "low" and len(paired.rounds[level]) < 5

    with FakeOpenAI(token_delay_s=0.01) as reference, \
            FakeOpenAI(model="stage-model", token_delay_s=0.01) as stage:
        _, paired = run_paired_load(
            Server(stage.base_url, "stage-model"), Server(reference.base_url, "fake-model"),
            "baseline", PROFILE, tmp_path, cores=plan_cores("cpu", usable=[0, 1]),
            more_rounds=more)
    assert [r.index for r in paired.rounds["low"]] == [0, 1, 2, 3, 4]
    assert [r.first for r in paired.rounds["low"]][3:] == ["stage", "reference"]
    assert len(paired.rounds["high"]) == 3
    assert ("low", 3) in asked and ("high", 3) in asked and ("low", 2) not in asked
