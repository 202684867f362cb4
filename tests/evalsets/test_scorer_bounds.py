"""Scoring that cannot be meant is refused where it is read: a regex that backtracks without end,
a reference no answer can miss, a data row with a key twice, a schema that reaches outside."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from evalsets.jsonl import read_jsonl
from evalsets.patterns import nested_repeat, score_regex
from evalsets.schema_refs import remote_ref
from evalsets.scorers import NumericScorer, RegexScorer, score_numeric
from evalsets.structured import item_schema
from infra.errors import MeasurementError, SpecError


def test_a_backtracking_search_fails_the_measurement_in_one_line_instead_of_hanging():
    # An overlapping alternation (validate refuses it): only the search's timeout bounds it here.
    with pytest.raises(MeasurementError, match=r"pattern '\(a\|aa\)\+\$' took over 1 s on a "
                                               r"61-character answer"):
        score_regex("a" * 60 + "!", "(a|aa)+$")
    assert score_regex("due 2024-03-01.", r"\b2024-03-01\b")


@pytest.mark.parametrize("pattern", ["(a+)+$", r"(\w+\s?)*$", "(?:x|(a*))*", "((ab)*c)*"])
def test_nested_repeats_are_refused_at_validate_saying_how_to_fix_them(pattern):
    with pytest.raises(ValidationError, match="nests a repeat inside a repeat"):
        RegexScorer(kind="regex", pattern=pattern)
    assert RegexScorer(kind="regex", field="pattern").problem({"pattern": pattern})[0] == "pattern"


@pytest.mark.parametrize("pattern", ["(a|aa)+$", "^(a|a)*$", r"(?:\s|.)*$", "(.*a){20}",
                                     r"(\s*\w+){1,20}$", "(a?){30}a{30}"])
def test_a_repeated_part_that_matches_one_text_two_ways_is_refused_at_validate(pattern):
    # None nests an unbounded repeat in another: each backtracks through its ambiguity instead.
    assert nested_repeat(pattern) is None
    with pytest.raises(ValidationError, match="can match the same text in more than one way"):
        RegexScorer(kind="regex", pattern=pattern)
    field, why = RegexScorer(kind="regex", field="pattern").problem({"pattern": pattern})
    assert field == "pattern" and f"pattern {pattern!r} repeats a part" in why


@pytest.mark.parametrize("pattern", [r"\b2020-01-02\b", "(a++)+$", "(?>a+)+$", r"a{2,}b+",
                                     r"^(yes|no)\.?$", "(foo|bar)*$", "(x|xy)*z",
                                     "(?:[^,]*,){12}", "(a|b){3}",
                                     r"(?i)the answer is (\-?[0-9\.\,]+)"])
def test_patterns_without_nested_backtracking_pass(pattern):
    assert nested_repeat(pattern) is None
    RegexScorer(kind="regex", pattern=pattern)


def test_an_infinite_reference_or_tolerance_cannot_score_every_answer_right():
    scorer = NumericScorer(kind="numeric", field="answer", tolerance=0.5)
    for value in ("inf", "-Infinity", "nan", float("inf")):
        field, why = scorer.problem({"answer": value})
        assert field == "answer" and "is not a finite number" in why
    assert not score_numeric("42", float("inf"), 0.5, 0.5)
    for tolerance in (float("inf"), float("nan")):
        with pytest.raises(ValidationError, match="finite number"):
            NumericScorer(kind="numeric", tolerance=tolerance)
    with pytest.raises(ValidationError, match="wrong sign scores right"):
        NumericScorer(kind="numeric", relative=2)


def test_a_jsonl_key_given_twice_or_a_nan_constant_is_named_by_file_line_and_key(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": 1, "answer": 2}\n\n{"id": 2, "meta": {"k": 1, "k": 2}}\n')
    with pytest.raises(SpecError) as raised:
        read_jsonl(path)
    assert str(raised.value) == (f"{path}:3: key 'k' is given twice in one object (JSON would "
                                 "keep the second silently); keep one")
    path.write_text('{"id": 1, "answer": NaN}\n')
    with pytest.raises(SpecError, match=r"rows\.jsonl:1: NaN is not a JSON number"):
        read_jsonl(path)


def test_only_local_schema_references_are_followed():
    local = {"$defs": {"a": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/a"}}}
    assert remote_ref(local) is None
    assert remote_ref({"items": [{"$ref": "http://evil.example/s"}]}) == "http://evil.example/s"
    assert item_schema({"id": 1, "schema": local}) == local
    with pytest.raises(MeasurementError, match=r"item 7: schema \$ref 'file:///etc/s\.json' is not local"):
        item_schema({"id": 7, "schema": {"$ref": "file:///etc/s.json"}})


def test_a_search_past_its_time_bound_names_the_item_it_scored(tmp_path):
    from evalsets.runner import load_task_config
    from evalsets.spec import EvalSetSpec

    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "q1", "prompt": "p", "pattern": "x"}\n')
    spec = EvalSetSpec(name="mine", path=path, scorer={"kind": "regex", "field": "pattern"})
    config = load_task_config(spec)
    doc = {"id": "q1", "row": '{"id": "q1", "prompt": "p", "pattern": "(a|aa)+$"}'}
    with pytest.raises(MeasurementError) as raised:
        config["process_results"](doc, ["a" * 60 + "!"])
    assert str(raised.value).startswith(f"{path}: item 'q1': regex scorer: pattern '(a|aa)+$' "
                                        "took over 1 s")
    assert config["process_results"](doc | {"row": '{"id": "q1", "pattern": "a+!"}'},
                                      ["a!"]) == {"score": 1.0}


def test_a_row_nested_past_any_bound_is_one_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"id": 1, "answer": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    with pytest.raises(SpecError, match=r"rows\.jsonl:1: nested too deeply to read; flatten"):
        read_jsonl(path)


def test_a_csv_column_given_twice_is_named(tmp_path):
    from evalsets.userset import read_rows

    path = tmp_path / "rows.csv"
    path.write_text("id,prompt,answer,answer\n1,p,2,3\n")
    with pytest.raises(SpecError, match=r"rows\.csv:1: column 'answer' is given twice in the header"):
        read_rows(path)


@pytest.mark.parametrize(("scorer", "answer"), [
    ({"kind": "numeric", "tolerance": 1e300}, "0"),
    ({"kind": "numeric", "tolerance": 19.5}, "20.5"),
    ({"kind": "numeric", "relative": 1}, "0"),
])
def test_a_tolerance_one_answer_meets_on_every_row_is_refused_at_validate(tmp_path, scorer, answer):
    from evalsets.contracts import validate_sets
    from evalsets.spec import EvalSetSpec

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f'{{"id": "r{i}", "prompt": "p{i}", "answer": {i}}}\n'
                            for i in range(1, 41)))
    with pytest.raises(SpecError) as raised:
        validate_sets([EvalSetSpec(name="mine", path=path, scorer=scorer)])
    assert str(raised.value).startswith(f"{path}:1: field 'answer' (id 'r1'): scorer tolerance ")
    assert (f"the one answer {answer} would score every row right, so the set measures nothing; "
            "give a tolerance smaller than half the spread of the references") in str(raised.value)
    assert validate_sets([EvalSetSpec(name="mine", path=path,
                                      scorer={"kind": "numeric", "tolerance": 0.5})]) == {"mine": 40}


def test_a_generation_budget_no_context_holds_names_max_gen_toks(tmp_path):
    from evalsets.contracts import check_prompts_fit
    from tests.evalsets.test_userset import ROWS, _tokenizer, user_set, write_jsonl

    spec = user_set(write_jsonl(tmp_path / "t.jsonl", ROWS), max_gen_toks=10**12)
    with pytest.raises(SpecError) as raised:
        check_prompts_fit([spec], 4096, _tokenizer(tmp_path / "tokenizer.json"))
    assert str(raised.value) == (
        "eval set 'tickets': max_gen_toks 1,000,000,000,000 leaves no room for a prompt in "
        "engine.max_model_len 4,096 (64 tokens go to the template); give max_gen_toks at most "
        "4,031")
