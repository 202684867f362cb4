"""lm-eval's own tasks by name: lm-eval's task config on local data, offline, paired per document,
with flips and the recovery table as for any set (against small fake servers)."""

from __future__ import annotations

import re

import pytest

from evalsets import lmeval_task, runner
from evalsets.contracts import validate_sets
from evalsets.results import QualityResult
from evalsets.spec import EvalSetSpec
from gates.policy import GatePolicy
from gates.record import StageRecord
from gates.recovery import recovery_table
from gates.report import flipped_items
from infra.errors import SpecError
from tests.evalsets.chat_fake import FakeChat
from tests.evalsets.lmeval_data import arc_easy, gsm8k, gsm8k_repository
from tests.evalsets.test_userset_choice import server, tokenizer_dir  # noqa: F401 (a fixture)


@pytest.fixture
def empty_hf_cache(tmp_path, monkeypatch):
    """A Hugging Face cache with nothing in it, whatever this machine holds."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    return tmp_path / "hf"


def answering(answer: str) -> FakeChat:
    return FakeChat(answer=answer).start()


def run(spec: EvalSetSpec, answer: str, out, **kwargs):
    fake = answering(answer)
    try:
        return runner.run_evalset(fake.base_url, "fake-model", spec, out, None,
                                  num_concurrent=1, **kwargs), fake
    finally:
        fake.stop()


def test_a_named_task_is_named_by_it_and_typos_are_caught(tmp_path):
    spec = EvalSetSpec.model_validate({"lm_eval": "gsm8k", "num_fewshot": 5, "limit": 500})
    assert (spec.name, spec.num_fewshot, spec.limit) == ("gsm8k", 5, 500)
    with pytest.raises(ValueError, match=r"'gsm8kk' is not an lm-eval task; did you mean 'gsm8k'"):
        EvalSetSpec.model_validate({"lm_eval": "gsm8kk"})
    with pytest.raises(ValueError, match=r"'mmlu' is an lm-eval group of tasks; name one of"):
        EvalSetSpec.model_validate({"lm_eval": "mmlu"})
    with pytest.raises(ValueError, match=r"scorer do not apply to an lm-eval task"):
        EvalSetSpec.model_validate({"lm_eval": "gsm8k", "scorer": {"kind": "exact"}})
    with pytest.raises(ValueError, match=r"num_fewshot only apply to an lm-eval task"):
        EvalSetSpec.model_validate({"name": "math", "num_fewshot": 3})
    with pytest.raises(ValueError, match=r"data .* is not a folder"):
        EvalSetSpec.model_validate({"lm_eval": "gsm8k", "data": str(tmp_path / "none")})


def test_the_task_index_is_built_once_per_lm_eval_version_and_read_after(tmp_path, monkeypatch):
    from lm_eval.tasks._index import TaskIndex

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    lmeval_task.task_index.cache_clear()
    built = lmeval_task.task_yaml("gsm8k")
    (stored,) = (tmp_path / "quantgate").glob("lmeval-tasks-*.json")

    def never(*_, **__):
        raise AssertionError("the stored index was not read")

    monkeypatch.setattr(TaskIndex, "build", never)
    lmeval_task.task_index.cache_clear()
    assert lmeval_task.task_yaml("gsm8k") == built and built.is_file()
    assert lmeval_task.task_index()["mmlu"].kind == "GROUP"
    stored.write_text("{damaged")  # rebuilt, not trusted
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    lmeval_task.task_index.cache_clear()
    assert lmeval_task.task_yaml("gsm8k") == built
    lmeval_task.task_index.cache_clear()


def test_missing_data_says_where_to_put_it_without_reaching_the_hub(empty_hf_cache):
    spec = EvalSetSpec.model_validate({"lm_eval": "gsm8k"})
    with pytest.raises(SpecError) as err:
        validate_sets([spec])
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("eval set 'gsm8k': lm-eval task 'gsm8k': its data (openai/gsm8k/main) "
                           "is not available offline; put it in the Hugging Face cache")
    assert "datasets.load_dataset('openai/gsm8k', 'main')" in line
    assert "give the set `data:` a folder with test.jsonl, train.jsonl" in line


def test_a_local_folder_missing_a_split_is_named(tmp_path):
    folder = tmp_path / "gsm"
    folder.mkdir()
    (folder / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    spec = EvalSetSpec.model_validate({"lm_eval": "gsm8k", "data": str(folder)})
    with pytest.raises(SpecError, match=r"data: .*gsm: no train split; the task reads splits "
                                        r"test, train: put them as test.jsonl, train.jsonl"):
        validate_sets([spec])


def test_validate_counts_the_docs_and_says_where_they_came_from(tmp_path):
    folder = gsm8k(tmp_path / "gsm", n=8)
    spec = EvalSetSpec.model_validate({"lm_eval": "gsm8k", "data": str(folder)})
    assert validate_sets([spec]) == {"gsm8k": 8}
    assert lmeval_task.check_data(spec).line("gsm8k") == (
        f"eval set gsm8k: lm-eval task gsm8k (generate_until, filter strict-match), 8 items, "
        f"data offline from {folder}")


def test_a_copy_of_the_hub_repository_is_read_by_its_own_configs(tmp_path):
    folder = gsm8k_repository(tmp_path / "openai-gsm8k", n=30)
    spec = EvalSetSpec.model_validate({"lm_eval": "gsm8k", "data": str(folder)})
    config = runner.load_task_config(spec)
    assert (config["dataset_path"], config["dataset_name"]) == (str(folder), "main")
    assert validate_sets([spec]) == {"gsm8k": 30}


def test_gsm8k_runs_through_lm_evals_own_config_paired_on_its_doc_identity(tmp_path):
    spec = EvalSetSpec.model_validate({"lm_eval": "gsm8k", "num_fewshot": 2,
                                       "data": str(gsm8k(tmp_path / "gsm", n=6))})
    baseline, fake = run(spec, "Two and two make four. #### 4", tmp_path / "base")
    # lm-eval's own prompt: its template, its two few-shot turns, its stop sequences.
    body = fake.requests[0]
    assert len(body["messages"]) == 5 and body["messages"][-1]["content"].startswith("Question:")
    assert "Question:" in body["stop"]
    assert baseline.metric == "exact_match"
    scores = {item.id.split(":")[0]: item.score for item in baseline.items}
    assert scores == {"0": 0.0, "1": 1.0, "2": 0.0, "3": 0.0, "4": 0.0, "5": 0.0}  # 2 + 2 = 4
    assert all(len(item.id.split(":")[1]) == 12 for item in baseline.items)
    candidate, _ = run(spec, "I think it is #### 6", tmp_path / "cand")
    assert [i.id for i in candidate.items] == [i.id for i in baseline.items]

    def record(name, parent, task):
        return StageRecord(name=name, kind="baseline" if parent is None else "weights",
                           parent=parent, axes={}, quality=QualityResult(tasks={"gsm8k": task}))

    records = [record("baseline", None, baseline), record("w4", "baseline", candidate)]
    (flips,) = flipped_items(records)
    assert [(row["id"].split(":")[0], row["direction"]) for row in flips["rows"]] == [
        ("1", "correct->wrong"), ("2", "wrong->correct")]
    row = recovery_table(records[0], records[1], GatePolicy()).rows[0]
    assert (row.task, row.baseline, row.candidate, row.items) == ("gsm8k", 1 / 6, 1 / 6, 6)


def test_a_later_batch_keeps_the_ids_of_the_whole_set_and_another_filter_scores(tmp_path):
    folder = gsm8k(tmp_path / "gsm", n=6)
    whole = EvalSetSpec.model_validate({"lm_eval": "gsm8k", "num_fewshot": 0, "data": str(folder)})
    first, _ = run(whole, "so 8", tmp_path / "whole")
    assert {i.score for i in first.items} == {0.0}  # strict-match wants '#### 8'
    flexible = whole.model_copy(update={"filter": "flexible-extract", "limit": 2})
    later, _ = run(flexible, "so 8", tmp_path / "later", start=3)
    assert [i.id for i in later.items] == [i.id for i in first.items[3:5]]
    assert [i.score for i in later.items] == [1.0, 0.0]  # doc 3 asks 4 plus 4
    # Few-shot examples come from a smaller train split: a batch past its end still has them.
    (folder / "train.jsonl").write_text("".join((folder / "train.jsonl").read_text()
                                                .splitlines(keepends=True)[:2]))
    shots = whole.model_copy(update={"num_fewshot": 2, "limit": 2})
    later, fake = run(shots, "#### 10", tmp_path / "shots", start=4)
    assert [i.id for i in later.items] == [i.id for i in first.items[4:6]]
    assert [i.score for i in later.items] == [1.0, 0.0]  # doc 4 asks 5 plus 5
    assert len(fake.requests[0]["messages"]) == 5  # two shots, each a question and its answer
    with pytest.raises(SpecError, match=r"filter 'flexible' is not one of .*did you mean "
                                        r"'flexible-extract'"):
        lmeval_task.chosen_filter(whole.model_copy(update={"filter": "flexible"}),
                                  runner.load_task_config(whole))


def test_a_multiple_choice_task_scores_log_likelihoods_on_completions(tmp_path, server):  # noqa: F811
    spec = EvalSetSpec.model_validate({"lm_eval": "arc_easy", "num_fewshot": 0,
                                       "data": str(arc_easy(tmp_path / "arc"))})
    assert lmeval_task.endpoint_problem([spec], chat_template=False) is None
    assert "is a multiple_choice task: it scores prompt log-probabilities" in \
        lmeval_task.endpoint_problem([spec], chat_template=True)
    task = runner.run_evalset(server, "m", spec, tmp_path / "out", None, apply_chat_template=False,
                              num_concurrent=1, tokenizer_dir=tokenizer_dir(tmp_path / "tok"))
    assert task.metric == "acc"
    assert [item.score for item in task.items] == [1.0, 0.0]  # the model always says shipping


def test_a_perplexity_task_is_refused_in_one_line():
    spec = EvalSetSpec.model_validate({"lm_eval": "wikitext"})
    with pytest.raises(SpecError, match=r"'wikitext' is a loglikelihood_rolling task, which "
                                        r"quantgate does not run \(it runs generate_until, "
                                        r"multiple_choice, loglikelihood"):
        runner.load_task_config(spec)


def test_run_quality_stores_a_named_task_beside_a_built_in_set(tmp_path):
    """The stage's quality run as the flow calls it: the server checked, lengths counted with the
    model's tokenizer, both sets stored and read back."""
    spec = EvalSetSpec.model_validate({"lm_eval": "gsm8k", "num_fewshot": 0,
                                       "data": str(gsm8k(tmp_path / "gsm", n=4))})
    math = EvalSetSpec(name="math", limit=3)
    fake, tokenizer = answering("#### 4"), tokenizer_dir(tmp_path / "tok")
    try:
        result = runner.run_quality(fake.base_url, "fake-model", [math, spec], tmp_path / "q",
                                    tokenizer, with_perplexity=False,
                                    max_model_len=4096)
    finally:
        fake.stop()
    stored = QualityResult.read(tmp_path / "q")
    assert set(stored.tasks) == set(result.tasks) == {"math", "gsm8k"}
    gsm = stored.tasks["gsm8k"]
    assert [item.score for item in gsm.items] == [0.0, 1.0, 0.0, 0.0]
    assert all(item.output_tokens == 1 and item.finish_reason == "stop" for item in gsm.items)
    assert (tmp_path / "q" / "samples_gsm8k.jsonl").is_file()
    assert (tmp_path / "q" / "gsm8k" / runner.SAMPLES_FILE).is_file()  # lm-eval's own log
    # The scoring corpus reads the baseline's answers from that log: one filter's samples, each
    # named as its item (found on the real engine: gsm8k's docs have no 'id' of their own).
    from evalsets.token_corpus import build_corpus, logged_items

    logged = logged_items(tmp_path / "q" / "gsm8k" / runner.SAMPLES_FILE)
    assert [item_id for item_id, _, _ in logged] == [item.id for item in gsm.items]
    corpus = build_corpus(tmp_path / "q", ["math", "gsm8k"], tokenizer, False)
    assert [s.name for s in corpus.sequences if s.name.startswith("gsm8k/")] == [
        f"gsm8k/{item.id}" for item in gsm.items]


def test_a_task_whose_own_code_needs_the_hub_is_refused_in_one_line(monkeypatch):
    # lm-eval's humaneval imports a metric from the Hub ('code_eval') when its config is read;
    # raised here as it is on a machine that never downloaded it.
    import lm_eval.tasks._yaml_loader as loader

    def needs_the_hub(path, **kwargs):
        raise FileNotFoundError("Couldn't find a module script at code_eval/code_eval.py.\nMore")

    monkeypatch.setattr(loader, "load_yaml", needs_the_hub)
    spec = EvalSetSpec.model_validate({"lm_eval": "humaneval"})
    with pytest.raises(SpecError) as err:
        validate_sets([spec])
    assert re.fullmatch(r"lm_eval: task 'humaneval': its config \(\S+/humaneval\.yaml\) cannot be "
                        r"loaded offline: FileNotFoundError: Couldn't find a module script at "
                        r"code_eval/code_eval\.py\.", str(err.value))


def test_a_named_task_can_be_sampled_each_pass_offline(tmp_path):
    spec = EvalSetSpec.model_validate({"lm_eval": "gsm8k", "num_fewshot": 0, "limit": 4,
                                       "data": str(gsm8k(tmp_path / "gsm", n=6)),
                                       "sampling": {"samples": 2, "temperature": 0.6}})
    task, fake = run(spec, "#### 4", tmp_path / "out")
    assert sorted({body["seed"] for body in fake.requests}) == [0, 1]
    assert all(item.samples is not None and len(item.samples) == 2 for item in task.items)
