"""User-set scorers: each kind accepts the right answer and refuses the wrong one."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from evalsets.scorers import (
    ChoiceScorer,
    Scorer,
    last_number,
    normalize,
    score_exact,
    score_json,
    score_numeric,
    score_regex,
)

SCORER = TypeAdapter(Scorer)


def scorer(**args):
    return SCORER.validate_python(args)


def test_normalize_ignores_case_whitespace_wrapping_and_final_punctuation():
    assert normalize('  "Refund   Request." ') == "refund request"
    assert normalize("**Yes!**") == "yes"


@pytest.mark.parametrize(("response", "right"), [
    ("Billing", True), ("  billing.  ", True), ("`BILLING`", True),
    ("Billing issue", False), ("Shipping", False), ("", False),
])
def test_exact(response, right):
    assert score_exact(response, "billing") is right
    assert scorer(kind="exact").score(response, {"answer": "billing"}) == float(right)


def test_regex_from_the_scorer_or_the_row():
    assert score_regex("Order #A-1234 shipped", r"#A-\d{4}")
    assert not score_regex("Order #A-12 shipped", r"#A-\d{4}")
    per_row = scorer(kind="regex", field="pattern")
    assert per_row.score("ticket T-77", {"pattern": r"^ticket T-\d+$"}) == 1.0
    assert per_row.score("it is T-77", {"pattern": r"^ticket T-\d+$"}) == 0.0
    assert per_row.problem({"pattern": "(unclosed"})[0] == "pattern"


def test_regex_needs_exactly_one_pattern_source_that_compiles():
    with pytest.raises(ValidationError, match="exactly one of 'pattern'"):
        scorer(kind="regex")
    with pytest.raises(ValidationError, match="not a regular expression"):
        scorer(kind="regex", pattern="(")


@pytest.mark.parametrize(("text", "number"), [
    ("The total is 1,234.50 dollars", 1234.5), ("from 3 to -7", -7.0), ("x = 2e3", 2000.0),
    ("no digits", None), ("ratio .5", 0.5),
])
def test_last_number(text, number):
    assert last_number(text) == number


def test_numeric_within_absolute_or_relative_tolerance():
    assert score_numeric("so 41.995", 42, tolerance=0.01)
    assert not score_numeric("so 41.9", 42, tolerance=0.01)
    assert score_numeric("about 1010", 1000, relative=0.01)
    assert not score_numeric("about 1011", 1000, relative=0.01)
    assert not score_numeric("no number here", 0)
    numeric = scorer(kind="numeric", field="answer", tolerance=0.5)
    assert numeric.score("It costs 12.4 euros", {"answer": "12"}) == 1.0
    assert numeric.score("It costs 13 euros", {"answer": 12}) == 0.0
    assert numeric.problem({"answer": "twelve"}) == ("answer", "'twelve' is not a number")


SCHEMA = {"type": "object", "required": ["city", "count"],
          "properties": {"city": {"type": "string"}, "count": {"type": "integer"}}}


def test_json_is_schema_validity_plus_field_match():
    assert score_json('```json\n{"city": "Oslo", "count": 3}\n```', SCHEMA, {"city": "oslo"})
    assert not score_json('{"city": "Oslo", "count": "3"}', SCHEMA)  # count is not an integer
    assert not score_json('{"city": "Oslo"}', SCHEMA)  # required count missing
    assert not score_json('{"city": "Bergen", "count": 3}', SCHEMA, {"city": "Oslo"})
    assert not score_json("no object", SCHEMA)
    per_row = scorer(kind="json", schema_field="schema", field="answer")
    row = {"schema": '{"type": "object", "required": ["n"]}', "answer": '{"n": 2}'}
    assert per_row.score('{"n": 2.0}', row) == 1.0 and per_row.score('{"n": 3}', row) == 0.0
    assert per_row.problem(row) is None
    assert per_row.problem(row | {"answer": '{"m": 1}'})[0] == "answer"
    assert per_row.problem(row | {"schema": '{"type": 5}'})[0] == "schema"


def test_json_schema_must_be_valid_and_given_once():
    with pytest.raises(ValidationError, match="not a valid JSON Schema"):
        scorer(kind="json", schema={"type": "no-such-type"})
    with pytest.raises(ValidationError, match="exactly one of 'schema'"):
        scorer(kind="json")


def test_code_runs_the_rows_tests_in_the_sandbox():
    code = scorer(kind="code")
    row = {"entry_point": "add", "tests": "assert add(2, 3) == 5\nassert add(-1, 1) == 0"}
    assert code.score("```python\ndef add(a, b):\n    return a + b\n```", row) == 1.0
    assert code.score("```python\ndef add(a, b):\n    return a - b\n```", row) == 0.0


def test_choice_gold_is_an_index_or_the_text_of_a_choice():
    choice = scorer(kind="choice")
    assert isinstance(choice, ChoiceScorer)
    assert choice.gold({"choices": ["red", "green"], "answer": 1}) == 1
    assert choice.gold({"choices": '["red", "green"]', "answer": "red"}) == 0  # CSV: JSON text
    assert choice.gold({"choices": ["1", "2"], "answer": "2"}) == 1  # the text wins
    assert choice.problem({"choices": ["red", "green"], "answer": 2})[0] == "answer"
    assert choice.problem({"choices": ["only"], "answer": 0})[0] == "choices"


def test_unknown_kind_is_named():
    with pytest.raises(ValidationError, match="exact.*regex.*numeric.*json.*code.*choice"):
        scorer(kind="fuzzy")


def test_code_tests_style_names_its_choices():
    assert scorer(kind="code", tests_style="humaneval").tests_style == "humaneval"
    with pytest.raises(ValidationError, match="tests_style 'human-eval': did you mean 'humaneval'"
                                              r"\? \(valid: asserts, auto, humaneval, mbpp\)"):
        scorer(kind="code", tests_style="human-eval")


def test_code_scorer_fields_are_what_the_contract_requires():
    assert scorer(kind="code").fields == ["tests", "entry_point"]
    assert scorer(kind="code", tests_field="test_list", entry_point_field=None,
                  reference_field="code").fields == ["test_list", "code"]
