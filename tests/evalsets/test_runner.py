"""lm-eval's per-sample log becomes paired QualityItems; the task config is made runnable."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from evalsets.results import QualityResult, TaskQuality
from evalsets.runner import (
    ServerFinish,
    check_server,
    cluster_field,
    group_field,
    load_task_config,
    primary_metric,
    prompt_hash,
    recording_model,
    samples_to_items,
)
from evalsets.spec import EvalSetSpec
from infra.errors import MeasurementError


def _sample(doc_id: int, item_id: str, response: str, score: float, saved: bool = False) -> dict:
    """The shape simple_evaluate(log_samples=True) returns for a generate_until task."""
    context = f'[{{"role": "user", "content": "Question {doc_id}"}}]'
    arguments = (
        {"gen_args_0": {"arg_0": context, "arg_1": {"max_gen_toks": 8}}}
        if saved
        else [(context, {"max_gen_toks": 8})]
    )
    return {
        "doc_id": doc_id,
        "doc": {"id": item_id, "question": f"Question {doc_id}", "answer": "5"},
        "target": "5",
        "arguments": arguments,
        "resps": [[response]],
        "filtered_resps": [response],
        "filter": "none",
        "metrics": ["exact_match"],
        "exact_match": score,
    }


def _word_count(text: str) -> int:
    return len(text.split())


def test_samples_become_items_in_doc_order():
    samples = [
        _sample(1, "math-0001", "one two three four five six seven eight", 0.0),
        _sample(0, "math-0000", "The answer is 5", 1.0),
    ]
    items = samples_to_items(samples, "exact_match", max_gen_toks=8, count_tokens=_word_count)
    assert [item.id for item in items] == ["math-0000", "math-0001"]
    first, second = items
    assert first.response == "The answer is 5"
    assert first.score == 1.0
    assert (first.output_tokens, first.finish_reason) == (4, "stop")
    assert (second.output_tokens, second.finish_reason) == (8, "length")
    assert first.prompt_hash == prompt_hash('[{"role": "user", "content": "Question 0"}]')
    assert len(first.prompt_hash) == 16 and first.prompt_hash != second.prompt_hash


def test_saved_sample_shape_gives_same_items():
    live = samples_to_items([_sample(0, "a", "5", 1.0)], "exact_match", 8, _word_count)
    saved = samples_to_items([_sample(0, "a", "5", 1.0, saved=True)], "exact_match", 8, _word_count)
    assert live == saved


def test_without_tokenizer_lengths_are_unknown():
    (item,) = samples_to_items([_sample(0, "a", "5", 1.0)], "exact_match", 8)
    assert item.output_tokens is None and item.finish_reason is None


def test_items_need_unique_ids():
    samples = [_sample(0, "same", "5", 1.0), _sample(1, "same", "4", 0.0)]
    with pytest.raises(MeasurementError, match="not unique.*same"):
        samples_to_items(samples, "exact_match", 8)
    no_id = _sample(0, "x", "5", 1.0)
    del no_id["doc"]["id"]
    with pytest.raises(MeasurementError, match="no 'id'"):
        samples_to_items([no_id], "exact_match", 8)


def test_missing_metric_is_named():
    with pytest.raises(MeasurementError, match="'acc'.*exact_match"):
        samples_to_items([_sample(0, "a", "5", 1.0)], "acc", 8)


def test_items_round_trip_through_quality_result(tmp_path):
    items = samples_to_items([_sample(0, "a", "5", 1.0)], "exact_match", 8, _word_count)
    result = QualityResult(tasks={"math": TaskQuality(task="math", metric="exact_match",
                                                      value=1.0, items=items)})
    result.save(tmp_path)
    assert QualityResult.read(tmp_path) == result
    row = json.loads((tmp_path / "samples_math.jsonl").read_text())
    assert row["id"] == "a"


def test_task_config_gets_absolute_data_and_overrides():
    config = load_task_config(EvalSetSpec(name="math", max_gen_toks=32))
    data = Path(config["dataset_kwargs"]["data_files"]["test"])
    assert data.is_absolute() and data.is_file()
    assert config["generation_kwargs"]["max_gen_toks"] == 32
    assert callable(config["process_results"])
    assert config["task"] == "qg_math"
    assert primary_metric(config) == "exact_match"


def test_task_config_default_budget():
    config = load_task_config(EvalSetSpec(name="math"))
    assert config["generation_kwargs"]["max_gen_toks"] == 96


def test_unreachable_server_is_a_measurement_error():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(MeasurementError, match=f"127.0.0.1:{port}.*not answering"):
        check_server(f"http://127.0.0.1:{port}", "m")


def test_server_reported_finish_wins_over_counting():
    samples = [_sample(0, "a", "cut off mid-wo", 0.0), _sample(1, "b", "5", 1.0)]
    reported = {"cut off mid-wo": ServerFinish("length", 8)}
    first, second = samples_to_items(samples, "exact_match", 8, _word_count, reported)
    assert (first.output_tokens, first.finish_reason) == (8, "length")
    assert (second.output_tokens, second.finish_reason) == (1, "stop")  # not reported: counted


@pytest.mark.parametrize("chat", [True, False])
def test_recording_model_keeps_finish_reason_and_tokens(chat):
    lm = recording_model(chat, model="m", base_url="http://127.0.0.1:9/v1/x", tokenizer_backend=None)
    def choice(index, text, finish):
        body = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        return {"index": index, "finish_reason": finish, **body}
    outputs = [
        {"choices": [choice(0, "The answer is 5", "stop")], "usage": {"completion_tokens": 5}},
        {"choices": [choice(0, "and so on and", "length")], "usage": {"completion_tokens": 96}},
    ]
    assert lm.parse_generations(outputs) == ["The answer is 5", "and so on and"]
    assert lm.server_finish == {
        "The answer is 5": ServerFinish("stop", 5),
        "and so on and": ServerFinish("length", 96),
    }


def test_group_comes_from_the_declared_doc_field():
    sample = _sample(0, "lc-512-000", "12345", 1.0)
    sample["doc"]["bucket"] = "512"
    (item,) = samples_to_items([sample], "exact_match", 8, group_field="bucket")
    assert item.group == "512"
    (plain,) = samples_to_items([_sample(0, "a", "5", 1.0)], "exact_match", 8)
    assert plain.group is None


def test_cluster_comes_from_the_contract_and_the_doc():
    sample = _sample(0, "math-0000", "17", 1.0)
    sample["doc"]["template"] = "add_small"
    (item,) = samples_to_items([sample], "exact_match", 8, cluster_field="template")
    assert item.cluster == "add_small" and item.group is None
    assert cluster_field(EvalSetSpec(name="math")) == "template"
    assert cluster_field(EvalSetSpec(name="long_context")) is None


def test_long_context_groups_field_and_selection():
    spec = EvalSetSpec(name="long_context", groups=["512", "2k"])
    assert group_field(spec) == "bucket"
    config = load_task_config(spec)
    docs = [{"bucket": b} for b in ("512", "1k", "2k", "4k")]

    class Rows(list):
        def filter(self, keep):
            return Rows(row for row in self if keep(row))

    assert config["process_docs"](Rows(docs)) == [{"bucket": "512"}, {"bucket": "2k"}]
    assert "process_docs" not in load_task_config(EvalSetSpec(name="long_context"))


def test_selecting_groups_needs_a_group_field():
    with pytest.raises(MeasurementError, match="declares no group field"):
        load_task_config(EvalSetSpec(name="math", groups=["a"]))


def test_run_quality_measures_one_stage_and_the_flow_pairs_its_stored_logprobs(tmp_path,
                                                                                monkeypatch):
    from evalsets import runner
    from evalsets.perplexity import LOGPROBS_FILE, PerplexityResult
    from flows.tasks import paired

    logprobs = {"model": "m", "top_logprobs": 5, "texts": {"t": {
        "tokens": ["token_id:1", "token_id:2"], "logprobs": [-0.1, -0.2],
        "top": [{"token_id:1": -0.1}, {"token_id:2": -0.2}]}}}

    def fake_perplexity(base_url, model, out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / LOGPROBS_FILE).write_text(json.dumps(logprobs))
        return PerplexityResult(texts=[], tokens=2, sum_logprob=-0.3, perplexity=1.16)

    monkeypatch.setattr(runner, "check_server", lambda *a: None)
    monkeypatch.setattr(runner, "token_counter", lambda *a: None)
    monkeypatch.setattr(runner, "measure_perplexity", fake_perplexity)
    base = tmp_path / "base"
    runner.run_quality("http://x", "m", [], base, tmp_path)
    stage = runner.run_quality("http://x", "m", [], tmp_path / "stage", tmp_path, corpus_from=base)
    # Measuring measures the stage alone; the pairing reads the two stored logprob files after.
    assert stage.divergence is None and stage.paired_tokens is None
    paired(stage, tmp_path / "stage", base, base)
    assert stage.divergence.mean_kl == 0.0 and stage.divergence.top1_agreement == 1.0
    assert QualityResult.read(tmp_path / "stage").divergence == stage.divergence
    assert stage.perplexity_vs_parent == stage.perplexity_vs_baseline
    logprobs["texts"]["t"]["tokens"][1] = "token_id:9"  # another tokenizer: no divergence
    other = runner.run_quality("http://x", "m", [], tmp_path / "other", tmp_path, corpus_from=base)
    paired(other, tmp_path / "other", base, base)
    assert other.divergence is None and other.paired_tokens is None
