"""The business set: its committed data, the three scorers on crafted answers, a
user's own JSONL validated with the line and field named."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from evalsets.business.grading import (
    BusinessItem,
    first_json_object,
    load_items,
    process_results,
    score,
    score_contains,
    score_exact,
    score_json,
)
from evalsets.spec import EvalSetSpec, registry
from infra.errors import SpecError

DATA_PATH = Path(__file__).resolve().parents[2] / "evalsets/business/data.jsonl"
ROWS = [json.loads(line) for line in DATA_PATH.read_text().splitlines()]


def test_at_least_300_items_covering_every_scorer_and_balanced_labels():
    items = load_items(DATA_PATH)
    assert len(items) >= 300
    assert len({item.id for item in items}) == len(items)
    assert len({item.prompt for item in items}) == len(items), "a prompt appears twice"
    assert {item.scorer for item in items} == {"exact", "contains", "json"}
    by_question = collections.defaultdict(collections.Counter)  # first line names the label set
    for item in items:
        if item.scorer == "exact":
            by_question[item.prompt.splitlines()[0]][item.reference] += 1
    assert len(by_question) == 3
    for counts in by_question.values():
        assert max(counts.values()) - min(counts.values()) <= 1, counts


def test_every_prefix_interleaves_the_groups():
    """`limit: N` takes the first N items: each group keeps its share of the pool in any prefix."""
    groups = [row["group"] for row in ROWS]
    share = {group: count / len(groups) for group, count in collections.Counter(groups).items()}
    assert set(share) == {"classify", "extract", "json"}
    for limit in (12, 20, 40, 100, 120, 200, 300):
        counts = collections.Counter(groups[:limit])
        for group, fraction in share.items():
            assert abs(counts[group] - fraction * limit) <= 2, (limit, counts)


def test_every_reference_scores_full_marks_and_a_wrong_answer_none():
    for item in load_items(DATA_PATH):
        assert score(item.reference, item) == 1.0, item.id
        assert score("I am not sure.", item) == 0.0, item.id


@pytest.mark.parametrize(
    ("response", "expected"),
    [("billing", True), (" Billing.", True), ("**billing**", True), ('"billing"', True),
     ("The label is billing", False), ("shipping", False), ("", False)],
)
def test_exact(response, expected):
    assert score_exact(response, "billing") is expected


def test_contains():
    assert score_contains("The invoice number is INV-48213.", "INV-48213")
    assert score_contains("inv-48213", "INV-48213")
    assert not score_contains("INV-4821", "INV-48213")


SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "quantity": {"type": "integer"}},
        "required": ["name", "quantity"],
        "additionalProperties": False,
    }
)
REFERENCE = json.dumps({"name": "Dana Lee", "quantity": 3})


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ('{"name": "Dana Lee", "quantity": 3}', True),
        ('```json\n{"name": "dana lee", "quantity": 3}\n```', True),
        ('Here it is: {"quantity": 3, "name": "Dana Lee"} Hope it helps', True),
        ('{"name": "Dana Lee", "quantity": "3"}', False),  # schema: quantity must be an integer
        ('{"name": "Dana Lee", "quantity": 3, "note": "x"}', False),  # no extra keys
        ('{"name": "Dana Lee"}', False),  # missing a required key
        ('{"name": "Dana Lee", "quantity": 4}', False),  # valid but wrong field
        ("{'name': 'Dana Lee', 'quantity': 3}", False),  # not JSON
        ('{"name": "Dana Lee", "quantity": 3', False),  # cut off
    ],
)
def test_json_schema_validity_and_field_match(response, expected):
    assert score_json(response, REFERENCE, SCHEMA) is expected


def test_first_json_object_skips_non_objects():
    assert first_json_object('[1, 2] then {"a": 1}') == {"a": 1}
    assert first_json_object("no json here") is None


def test_lm_eval_hook_takes_the_loaders_nulls():
    doc = {"id": "x", "prompt": "p", "scorer": "contains", "reference": "42", "schema": None, "group": None}
    assert process_results(doc, ["It is 42."]) == {"score": 1.0}


def test_user_jsonl_errors_name_the_line_and_field(tmp_path):
    good = {"id": "a", "prompt": "p", "scorer": "exact", "reference": "yes"}
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "id": "b", "scorer": "regex"}) + "\n")
    with pytest.raises(SpecError, match=r"mine.jsonl:2: scorer: .*exact.*contains.*json"):
        load_items(path)
    path.write_text(json.dumps({**good, "scorer": "json", "reference": '{"a": 1}', "schema": "{"}) + "\n")
    with pytest.raises(SpecError, match="mine.jsonl:1: .*schema is not JSON text"):
        load_items(path)
    bad_reference = {"type": "object", "properties": {"a": {"type": "string"}}}
    path.write_text(
        json.dumps({**good, "scorer": "json", "reference": '{"a": 1}', "schema": json.dumps(bad_reference)})
    )
    with pytest.raises(SpecError, match="reference fails its own schema"):
        load_items(path)
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(SpecError, match="not unique"):
        load_items(path)


def test_a_user_jsonl_runs_through_the_task_config(tmp_path):
    """A user's own file: JSONL + the data_files line of task.yaml; nothing else."""
    from datasets import load_dataset

    from evalsets.runner import load_task_config, primary_metric

    rows = [
        {"id": "u1", "prompt": "Label: spam or ham? 'WIN A PRIZE'", "scorer": "exact", "reference": "spam"},
        {"id": "u2", "prompt": "PO number in 'PO-77 due'?", "scorer": "contains", "reference": "PO-77"},
        {"id": "u3", "prompt": 'JSON with key "ok"', "scorer": "json", "reference": '{"ok": true}',
         "schema": json.dumps({"type": "object", "required": ["ok"]})},
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    load_items(path)  # what a `validate` command would call
    config = load_task_config(EvalSetSpec(name="business"))
    assert primary_metric(config) == "score"
    assert config["generation_kwargs"]["max_gen_toks"] <= 48
    docs = load_dataset("json", data_files={"test": str(path)})["test"]
    answers = {"u1": "spam", "u2": "It is PO-77.", "u3": '{"ok": true}'}
    assert [config["process_results"](doc, [answers[doc["id"]]]) for doc in docs] == [{"score": 1.0}] * 3
    assert "business" in registry()


def test_business_item_alias():
    item = BusinessItem.model_validate({"id": "a", "prompt": "p", "scorer": "exact", "reference": "x"})
    assert item.schema_ == "" and item.group is None
