"""Bring your own eval set: a spec points at a data file or a task folder, the contract names a
bad row by file, line and field before any engine, and the set runs like a built-in one."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from evalsets.contracts import check_prompts_fit, prompts_by_id, validate_sets
from evalsets.results import TaskQuality
from evalsets.runner import load_task_config, primary_metric, run_evalset
from evalsets.spec import EvalSetSpec
from infra.errors import SpecError
from tests.fake_openai import FakeOpenAI

pytest.importorskip("great_expectations")

# The fake server answers " tok" for every token: with a one-token budget the response is "tok".
ROWS = [{"id": i, "prompt": f"Question {i}: say tok", "answer": "tok" if i % 2 else "other"}
        for i in range(6)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def user_set(path: Path, scorer: dict | None = None, **more) -> EvalSetSpec:
    return EvalSetSpec(name="tickets", path=path, scorer=scorer or {"kind": "exact"}, **more)


def test_relative_path_resolves_against_the_spec_folder(tmp_path):
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "t.jsonl", ROWS)
    spec = EvalSetSpec.model_validate(
        {"name": "tickets", "path": "data/t.jsonl", "scorer": {"kind": "exact"}},
        context={"base_dir": tmp_path / "specs" / ".."})
    assert spec.path == (tmp_path / "data" / "t.jsonl").resolve()
    assert spec.info.data_file == spec.path


@pytest.mark.parametrize(("fields", "expected"), [
    ({"name": "math", "scorer": {"kind": "exact"}}, "scorer only apply to your own data file"),
    ({"name": "math", "path": "t.jsonl"}, "'math' is a built-in set"),
    ({"name": "mine", "path": "t.jsonl"}, "a data file needs a scorer"),
    ({"name": "../up", "path": "t.jsonl", "scorer": {"kind": "exact"}}, "letters, digits"),
    ({"name": "mine", "path": "gone.jsonl", "scorer": {"kind": "exact"}}, "does not exist"),
    ({"name": "mine", "path": "t.txt", "scorer": {"kind": "exact"}}, "unsupported data file"),
    ({"name": "mine", "path": ".", "scorer": {"kind": "exact"}}, "a folder needs an lm-eval"),
    ({"name": "mine", "path": "t.jsonl", "scorer": {"kind": "exact"}, "groups": ["a"]},
     "'groups' needs a folder set"),
])
def test_a_user_set_declaration_is_checked(tmp_path, fields, expected):
    write_jsonl(tmp_path / "t.jsonl", ROWS)
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(ValidationError, match=expected):
        EvalSetSpec.model_validate(fields, context={"base_dir": tmp_path})


def test_good_files_pass_their_contract_in_every_format(tmp_path):
    import pandas as pd

    jsonl = write_jsonl(tmp_path / "t.jsonl", ROWS)
    table = write_csv(tmp_path / "t.csv", ROWS)
    parquet = tmp_path / "t.parquet"
    pd.DataFrame(ROWS).to_parquet(parquet)
    for path in (jsonl, table, parquet):
        assert validate_sets([user_set(path)]) == {"tickets": len(ROWS)}


def _broken(tmp_path: Path, kind: str) -> tuple[Path, EvalSetSpec]:
    rows = [dict(row) for row in ROWS]
    scorer = {"kind": "exact"}
    if kind == "duplicate id":
        rows[3]["id"] = "1"  # 1 and "1" are one item: items pair by str(id)
    elif kind == "empty prompt":
        rows[2]["prompt"] = "  "
    elif kind == "missing scorer field":
        del rows[4]["answer"]
    elif kind == "not a number":
        scorer = {"kind": "numeric"}
        for row in rows:
            row["answer"] = "12"
        rows[1]["answer"] = "twelve"
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    return path, user_set(path, scorer)


@pytest.mark.parametrize(("kind", "expected"), [
    ("duplicate id", r"t.jsonl:2: row 2 \(id '1'.*broke rule 'id' is unique"),
    ("empty prompt", r"t.jsonl:3: row 3 \(id '2'.*prompt field 'prompt' is present and not blank"),
    ("missing scorer field",
     r"t.jsonl:5: row 5 \(id '4'.*reference field 'answer' is present and not blank"),
    ("not a number", r"t.jsonl:2: field 'answer' \(id '1'\): 'twelve' is not a number"),
])
def test_a_broken_row_is_named_by_file_line_and_field(tmp_path, kind, expected):
    path, spec = _broken(tmp_path, kind)
    with pytest.raises(SpecError, match=expected) as caught:
        validate_sets([spec])
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


def test_a_csv_line_counts_the_header(tmp_path):
    rows = [dict(row) for row in ROWS]
    rows[2]["prompt"] = ""
    path = write_csv(tmp_path / "t.csv", rows)
    with pytest.raises(SpecError, match=r"t.csv:4: row 3 \(id '2'.*prompt field 'prompt'"):
        validate_sets([user_set(path)])


@pytest.mark.parametrize(("raw", "expected"), [
    (b'{"id": 9, "prompt": "caf\xe9", "answer": "x"}\n', r"t.jsonl:7: not UTF-8 text"),
    (b'{"id": 9, "prompt": "unclosed\n', r"t.jsonl:7: not JSON"),
    (b'["a", "list"]\n', r"t.jsonl:7: a JSON list, not an object"),
])
def test_an_unreadable_line_is_named(tmp_path, raw, expected):
    path = write_jsonl(tmp_path / "t.jsonl", ROWS)
    path.write_bytes(path.read_bytes() + raw)
    with pytest.raises(SpecError, match=expected):
        validate_sets([user_set(path)])


def test_a_non_utf8_csv_names_its_line(tmp_path):
    path = write_csv(tmp_path / "t.csv", ROWS)
    path.write_bytes(path.read_bytes() + b'9,caf\xe9,x\n')
    with pytest.raises(SpecError, match=r"t.csv:8: not UTF-8 text"):
        validate_sets([user_set(path)])


def _tokenizer(path: Path) -> Path:
    """A whitespace word-level tokenizer: one token per word."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))
    return path


def test_a_prompt_too_long_for_the_served_context_is_named(tmp_path):
    rows = [dict(row) for row in ROWS]
    rows[4]["prompt"] = "word " * 300
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    spec = user_set(path, max_gen_toks=16)
    tokenizer = _tokenizer(tmp_path / "tokenizer.json")
    check_prompts_fit([spec], 512, tokenizer)
    with pytest.raises(SpecError, match=r"t.jsonl:5: field 'prompt' \(id '4'\): eval set 'tickets' "
                                        r"needs 380 tokens .* engine.max_model_len is 256"):
        check_prompts_fit([spec], 256, tokenizer)


def test_a_messages_column_is_a_dialogue_sent_turn_by_turn(tmp_path):
    from evalsets.multiturn import decode_dialogue

    turns = [{"role": "user", "content": "My order is 4411."},
             {"role": "assistant", "content": "Noted."},
             {"role": "user", "content": "What is my order number?"}]
    rows = [{"id": "d1", "messages": turns, "answer": "4411"}]
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    spec = user_set(path, {"kind": "numeric"})
    assert validate_sets([spec]) == {"tickets": 1}
    config = load_task_config(spec)
    assert config["metadata"]["multiturn"] is True
    doc = {"id": "d1", "row": json.dumps(rows[0])}
    assert decode_dialogue(config["doc_to_text"](doc)) == turns
    assert prompts_by_id(spec.info)["d1"].endswith("user: What is my order number?")
    write_jsonl(path, [rows[0] | {"messages": turns[:2]}])  # ends with the assistant
    with pytest.raises(SpecError, match=r"t.jsonl:1: field 'messages' \(id 'd1'\): .*last turn"):
        validate_sets([spec])


def test_choice_becomes_a_multiple_choice_task(tmp_path):
    rows = [{"id": "q1", "prompt": "Sky colour?", "choices": ["green", "blue"], "answer": "blue"}]
    spec = user_set(write_jsonl(tmp_path / "t.jsonl", rows), {"kind": "choice"})
    config = load_task_config(spec)
    doc = {"id": "q1", "row": json.dumps(rows[0])}
    assert config["output_type"] == "multiple_choice" and primary_metric(config) == "acc"
    assert config["doc_to_choice"](doc) == ["green", "blue"] and config["doc_to_target"](doc) == 1


def test_a_task_folder_anywhere_is_a_set(tmp_path):
    import shutil

    from evalsets.spec import registry

    folder = tmp_path / "my_math"
    shutil.copytree(registry()["math"].folder, folder,
                    ignore=shutil.ignore_patterns("__pycache__"))
    spec = EvalSetSpec(name="my_math", path=folder, limit=5)
    assert validate_sets([spec])["my_math"] >= 1000
    config = load_task_config(spec)
    assert Path(config["dataset_kwargs"]["data_files"]["test"]).parent == folder
    assert callable(config["process_results"])


@pytest.mark.parametrize("write", [write_jsonl, write_csv], ids=["jsonl", "csv"])
def test_a_user_file_runs_through_lm_eval_into_items(tmp_path, write):
    path = write(tmp_path / f"t.{'jsonl' if write is write_jsonl else 'csv'}", ROWS)
    spec = user_set(path, max_gen_toks=1)
    with FakeOpenAI() as fake:
        task = run_evalset(fake.base_url, fake.model, spec, tmp_path / "out", None,
                           apply_chat_template=False, num_concurrent=1)
    assert isinstance(task, TaskQuality) and task.task == "tickets" and task.metric == "score"
    assert [item.id for item in task.items] == [str(i) for i in range(6)]
    assert [item.score for item in task.items] == [0.0, 1.0] * 3
    assert task.value == 0.5
    assert {item.response.strip() for item in task.items} == {"tok"}
    assert len(fake.requests) == 6 and fake.requests[0]["prompt"] == "Question 0: say tok"
    assert (tmp_path / "out" / "tickets" / "lm_eval_samples.jsonl").is_file()


def test_choice_needs_the_completions_endpoint(tmp_path):
    from flows.spec import load_spec
    from tests.flows.test_spec import write_spec

    write_jsonl(tmp_path / "q.jsonl", [{"id": 1, "prompt": "p", "choices": ["a", "b"], "answer": 0}])
    choice = {"name": "quiz", "path": "q.jsonl", "scorer": {"kind": "choice"}}
    with pytest.raises(SpecError, match="'quiz' has a choice scorer.*set chat_template: false"):
        load_spec(write_spec(tmp_path, evalsets=[{"name": "math", "limit": 60}, choice]))
    spec = load_spec(write_spec(tmp_path, evalsets=[choice], chat_template=False))
    assert spec.evalsets[0].path == tmp_path / "q.jsonl"


def test_a_dialogue_file_needs_the_chat_template(tmp_path):
    from evalsets.contracts import check_chat_template

    turns = [{"role": "user", "content": "I am Ana."}, {"role": "assistant", "content": "Hi Ana."},
             {"role": "user", "content": "What is my name?"}]
    spec = user_set(write_jsonl(tmp_path / "t.jsonl", [{"id": 1, "messages": turns,
                                                        "answer": "Ana"}]))
    check_chat_template([spec], chat_template=True)
    with pytest.raises(SpecError, match="'tickets' is multi-turn.*chat_template: false"):
        check_chat_template([spec], chat_template=False)


def test_declared_field_names_map_onto_ids_and_prompts(tmp_path):
    rows = [{"ticket": 7, "question": "Route: double charge", "team": "billing"}]
    spec = user_set(write_csv(tmp_path / "t.csv", rows), {"kind": "exact", "field": "team"},
                    prompt_field="question", id_field="ticket")
    assert validate_sets([spec]) == {"tickets": 1}
    config = load_task_config(spec)
    (doc,) = config["custom_dataset"]()["test"]
    assert doc["id"] == "7" and config["doc_to_text"](doc) == "Route: double charge"
    assert config["process_results"](doc, ["Billing."]) == {"score": 1.0}
    assert config["process_results"](doc, ["shipping"]) == {"score": 0.0}
    with pytest.raises(SpecError, match=r"no field 'prompt' in any row"):
        validate_sets([user_set(tmp_path / "t.csv", {"kind": "exact", "field": "team"},
                                id_field="ticket")])


def test_a_user_file_declares_groups_and_clusters_that_reach_the_items(tmp_path):
    rows = [row | {"level": "hard" if row["id"] % 2 else "easy", "source": f"doc{row['id'] // 3}"}
            for row in ROWS]
    spec = user_set(write_jsonl(tmp_path / "t.jsonl", rows), max_gen_toks=1,
                    group_field="level", cluster_field="source")
    validate_sets([spec])
    with FakeOpenAI() as fake:
        task = run_evalset(fake.base_url, fake.model, spec, tmp_path / "out", None,
                           apply_chat_template=False, num_concurrent=1)
    assert [item.group for item in task.items] == ["easy", "hard"] * 3
    assert [item.cluster for item in task.items] == ["doc0"] * 3 + ["doc1"] * 3
    missing = [row | {"level": "easy"} for row in ROWS]
    with pytest.raises(SpecError, match="source"):
        validate_sets([user_set(write_jsonl(tmp_path / "m.jsonl", missing),
                                group_field="level", cluster_field="source")])
    with pytest.raises(ValidationError, match="cluster_field"):
        EvalSetSpec(name="math", cluster_field="template")
