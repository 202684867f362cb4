"""Every regular expression a user gives (a regex scorer's pattern, a row's own, a JSON Schema's
`pattern`, an IFEval keyword, an lm-eval filter) is compiled where it is read: one Python warns
about ("Possible nested set", a FutureWarning) is refused in one line naming the set, the field
and the pattern, and no warning line reaches the user."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from evalsets.instruction_checks import problem as instructions_problem
from evalsets.patterns import regex_problem, schema_patterns, score_regex
from evalsets.scorers import JsonScorer, RegexScorer
from evalsets.task_code import check_task_patterns
from flows.cli import app
from infra.errors import MeasurementError, SpecError
from tests.flows.test_bad_inputs import base_spec
from tests.infra.test_cpu_support import AVX512

NESTED_SET = "[[a]"  # Python: "FutureWarning: Possible nested set at position 1"
runner = CliRunner()


def validate(tmp_path: Path, spec: dict) -> tuple[list[str], list[warnings.WarningMessage]]:
    """validate's output lines and every warning raised while it ran (shown or not)."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "400"})
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, (result.output, result.exception)
    return lines, [w for w in caught if issubclass(w.category, FutureWarning | SyntaxWarning)]


def user_set(tmp_path: Path, rows: list[dict], scorer: dict) -> dict:
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"name": "mine", "path": "mine.jsonl", "scorer": scorer}


def test_the_warning_is_found_every_time_not_only_on_the_first_compile():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        re.compile(NESTED_SET)  # in re's cache now: compiling it again would not warn
    for _ in range(2):
        problem = regex_problem(NESTED_SET)
        assert problem.startswith(f"pattern {NESTED_SET!r}: Python warns \"Possible nested set "
                                  "at position 1\" (FutureWarning)")
        assert "a literal '[' as '\\['" in problem
    assert regex_problem(r"[\[a]") is None


def test_a_sets_pattern_is_refused_at_validate_in_one_line_without_the_warning(tmp_path,
                                                                                monkeypatch):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    monkeypatch.chdir(tmp_path)
    spec = base_spec(tmp_path)
    spec["evalsets"].append(user_set(tmp_path, [{"id": 1, "prompt": "p"}],
                                     {"kind": "regex", "pattern": NESTED_SET}))
    lines, caught = validate(tmp_path, spec)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert "evalsets.1" in lines[0] and "pattern" in lines[0] and repr(NESTED_SET) in lines[0]
    assert "Possible nested set" in lines[0]
    assert caught == []


def test_a_rows_own_pattern_is_refused_naming_the_set_the_row_and_the_field(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    monkeypatch.chdir(tmp_path)
    spec = base_spec(tmp_path)
    rows = [{"id": 1, "prompt": "p", "pattern": "ok"}, {"id": 2, "prompt": "q", "pattern": NESTED_SET}]
    spec["evalsets"].append(user_set(tmp_path, rows, {"kind": "regex", "field": "pattern"}))
    lines, caught = validate(tmp_path, spec)
    assert len(lines) == 1, lines
    assert "mine" in lines[0] and "pattern" in lines[0] and repr(NESTED_SET) in lines[0], lines
    assert "Possible nested set" in lines[0]
    assert caught == []


def test_a_json_schemas_patterns_are_regular_expressions_too():
    schema = {"type": "object", "properties": {"zip": {"type": "string", "pattern": NESTED_SET}}}
    assert schema_patterns(schema) == [("/properties/zip/pattern", NESTED_SET)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValidationError, match=r"'schema': /properties/zip/pattern: pattern "
                                                  r"'\[\[a\]': Python warns"):
            JsonScorer(kind="json", schema=schema)
        field, why = JsonScorer(kind="json", schema_field="schema").problem(
            {"schema": json.dumps({"patternProperties": {"(a+)+$": {}}})})
    assert field == "schema" and why.startswith("/patternProperties/(a+)+$: pattern")
    assert "nests a repeat inside a repeat" in why
    assert [w for w in caught if issubclass(w.category, FutureWarning)] == []
    JsonScorer(kind="json", schema={"properties": {"zip": {"pattern": "^[0-9]{5}$"}}})


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"keywords": ["**note**"]}, r"keywords '\*\*note\*\*' is read as a regular expression by "
                                 r"IFEval's checker: pattern '\*\*note\*\*' is not a regular "
                                 r"expression: nothing to repeat.*for the literal text write "
                                 r"'\\\*\\\*note\\\*\\\*'$"),
    ({"keywords": ["cat", NESTED_SET]}, r"keywords '\[\[a\]'.*Possible nested set"),
])
def test_ifeval_arguments_it_reads_as_patterns_are_checked(kwargs, needle):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        field, why = instructions_problem(["keywords:existence"], [kwargs])
    assert field == "kwargs"
    assert re.search(needle, why), why
    assert [w for w in caught if issubclass(w.category, FutureWarning)] == []
    assert instructions_problem(["keywords:existence"], [{"keywords": ["cat", "dog"]}]) is None


def test_an_lm_eval_filter_pattern_in_a_task_folder_is_refused_naming_the_key(tmp_path):
    config = {"filter_list": [{"name": "strict", "filter": [
        {"function": "regex", "regex_pattern": "#### (\\-?[0-9.,]+)"}, {"function": "take_first"}]},
        {"name": "loose", "filter": [{"function": "regex", "regex_pattern": NESTED_SET}]}]}
    with pytest.raises(SpecError) as raised:
        check_task_patterns(tmp_path / "task.yaml", config)
    assert str(raised.value).startswith(
        f"{tmp_path / 'task.yaml'}: filter_list[1].filter[0].regex_pattern: pattern '[[a]': "
        "Python warns \"Possible nested set")
    del config["filter_list"][1]
    check_task_patterns(tmp_path / "task.yaml", config)


def test_a_good_pattern_still_scores():
    scorer = RegexScorer(kind="regex", pattern=r"\b2024-03-01\b")
    assert scorer.score("due 2024-03-01.", {}) == 1.0


REGEX_PIECES = st.sampled_from(["[", "]", "[[", "--", "&&", "~~", "||", "(", ")", "+", "*", "?",
                                "{2,}", "\\", "a", "b", "^", "$", ".", "|", "(?:", "(?P<n>", "\\d"])


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(REGEX_PIECES, max_size=10).map("".join))
def test_any_pattern_is_either_refused_in_one_line_or_compiles_without_a_warning(pattern):
    """The fuzzer's hostile patterns: validate's answer is one line, or the pattern is clean."""
    problem = regex_problem(pattern)
    if problem is not None:
        assert "\n" not in problem and repr(pattern) in problem
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning the check missed fails here
        re._compiler.compile(pattern)  # past re's cache, which warns once per process
    try:  # scoring ends: a result, or (backtracking past its time bound) one line
        assert isinstance(score_regex("a" * 50 + "!", pattern), bool)
    except MeasurementError as exc:
        assert "\n" not in str(exc) and "took over" in str(exc)
