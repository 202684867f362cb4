"""Code tests as HumanEval, MBPP and plain asserts ship them: the convention is read off the data
or declared, answers in either shape run, and validate refuses tests that cannot fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from evalsets.code_tests import build_task, detect_style, first_called
from evalsets.contracts import validate_sets
from evalsets.scorers import Scorer
from evalsets.spec import EvalSetSpec
from infra.errors import SpecError

pytest.importorskip("great_expectations")

ROWS_DIR = Path(__file__).resolve().parent / "code_rows"
MBPP = ROWS_DIR / "mbpp.jsonl"
ASSERTS = ROWS_DIR / "asserts.jsonl"
MBPP_SCORER = {"kind": "code", "tests_field": "test_list", "entry_point_field": None}

# HumanEval's shape, small: the prompt holds an import, a helper and the signature + docstring;
# the tests define check(candidate) and leave calling it to the harness.
PROMPT = ('import math\n\n\ndef _square(x):\n    return x * x\n\n\n'
          'def hypotenuse(a: float, b: float) -> float:\n    """The hypotenuse of a right '
          'triangle with legs a and b."""\n')
HUMANEVAL_ROW = {
    "task_id": "Mini/0", "prompt": PROMPT, "entry_point": "hypotenuse",
    "canonical_solution": "    return math.sqrt(_square(a) + _square(b))\n",
    "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate(3, 4) == 5\n"
            "    assert candidate(5, 12) == 13\n",
}
HUMANEVAL_SCORER = {"kind": "code", "tests_field": "test", "entry_point_field": "entry_point"}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def code_set(path: Path, scorer: dict, **more) -> EvalSetSpec:
    return EvalSetSpec(name="code_own", path=path, scorer=scorer, **more)


@pytest.mark.parametrize(("tests", "style"), [
    (["assert f(1) == 2"], "mbpp"),
    ('["assert f(1) == 2"]', "mbpp"),  # a CSV cell holds the list as JSON text
    (HUMANEVAL_ROW["test"], "humaneval"),
    (HUMANEVAL_ROW["test"] + "\ncheck(hypotenuse)\n", "asserts"),  # calls its own check
    ("assert f(1) == 2\n", "asserts"),
    ("assert f(1 ==\n", "asserts"),  # the row check names the syntax error
])
def test_the_convention_is_read_off_the_tests(tests, style):
    assert detect_style(tests) == style


def test_the_entry_point_is_the_first_function_the_tests_call_that_they_do_not_bind():
    assert first_called("assert set(similar(a, b)) == {4}\nassert similar(b, a)\n") == "similar"
    assert first_called("import math\nassert math.isclose(area(1), math.pi)\n") == "area"
    assert first_called("def helper(x):\n    return x\nassert helper(go(1)) == 1\n") == "go"


@pytest.mark.parametrize(("answer", "wrong"), [
    # the body, as HumanEval's completions are; then from column 0
    ("    return math.sqrt(_square(a) + _square(b))\n", "    return a + b\n"),
    ("return math.sqrt(_square(a) + _square(b))\n", "return a + b\n"),
    # the whole function (the prompt's helper and import still there), fenced or not
    ("def hypotenuse(a, b):\n    return math.sqrt(_square(a) + _square(b))\n",
     "def hypotenuse(a, b):\n    return 'nonsense'\n"),
    ("```python\nimport math\n\ndef hypotenuse(a, b):\n    return math.hypot(a, b)\n```",
     "```python\ndef hypotenuse(a, b):\n    return a * b\n```"),
    # a body whose first line lost its indent
    ("```python\nx = _square(a) + _square(b)\n    return math.sqrt(x)\n```",
     "```python\nx = _square(a) + b\n    return math.sqrt(x)\n```"),
])
def test_a_humaneval_answer_passes_as_a_body_or_as_the_whole_function(answer, wrong):
    scorer = TypeAdapter(Scorer).validate_python(HUMANEVAL_SCORER)
    assert scorer.score(answer, HUMANEVAL_ROW) == 1.0
    assert scorer.score(wrong, HUMANEVAL_ROW) == 0.0


def test_a_humaneval_file_passes_validate_with_the_stub_and_the_reference(tmp_path):
    path = write_jsonl(tmp_path / "mini.jsonl", [HUMANEVAL_ROW])
    assert validate_sets([code_set(path, HUMANEVAL_SCORER, id_field="task_id")]) == {"code_own": 1}


def test_mbpp_rows_run_their_test_list_after_the_setup_code(tmp_path):
    spec = code_set(MBPP, MBPP_SCORER, id_field="task_id", prompt_field="text")
    assert validate_sets([spec]) == {"code_own": 4}
    rows = rows_of(MBPP)
    area = next(row for row in rows if row["test_setup_code"])
    assert spec.scorer.task(area).entry_point == "circle_area"
    assert spec.scorer.score(f"```python\n{area['code']}```", area) == 1.0
    assert spec.scorer.score("def circle_area(r):\n    return 3.14 * r * r\n", area) == 0.0
    similar = rows[0]
    assert spec.scorer.task(similar).entry_point == "similar_elements"  # not the builtin set()
    assert spec.scorer.score("def similar_elements(a, b):\n    return tuple(a)\n", similar) == 0.0


def test_mbpp_from_csv_reads_the_list_from_json_text(tmp_path):
    import csv

    path = tmp_path / "mbpp.csv"
    rows = rows_of(MBPP)
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=["task_id", "text", "code", "test_list",
                                                 "test_setup_code"])
        writer.writeheader()
        for row in rows:
            writer.writerow({key: json.dumps(row[key]) if key == "test_list" else row[key]
                             for key in writer.fieldnames})
    scorer = dict(MBPP_SCORER, tests_style="mbpp")
    assert validate_sets([code_set(path, scorer, id_field="task_id", prompt_field="text")]) == \
        {"code_own": 4}


def test_plain_asserts_keep_running_as_they_are():
    spec = code_set(ASSERTS, {"kind": "code"})
    assert validate_sets([spec]) == {"code_own": 3}
    add = rows_of(ASSERTS)[0]
    assert spec.scorer.task(add).tests == add["tests"]
    assert spec.scorer.score("def add(a, b):\n    return a + b\n", add) == 1.0
    assert spec.scorer.score("def add(a, b):\n    return a * b\n", add) == 0.0


def _broken(rows: list[dict], kind: str) -> tuple[list[dict], dict]:
    """(rows, scorer) with row 2 (line 2) broken in one way."""
    rows = [dict(row) for row in rows]
    second = rows[1]
    if kind == "tests that cannot fail":
        second["tests"] = "assert shout('hi') is None or True\n"
    elif kind == "reference that fails":
        second["canonical_solution"] = "def shout(text):\n    return text + '!'\n"
    elif kind == "tests that do not parse":
        second["tests"] = "assert shout('hi' == 'HI!'\n"
    elif kind == "no entry point":
        second["entry_point"] = "not a name"
    return rows, {"kind": "code"}


@pytest.mark.parametrize(("kind", "expected"), [
    ("tests that cannot fail", r"field 'tests' \(id 'a2'\): the tests pass a stub shout\(\) "
                               r"that returns None, so they cannot fail a wrong answer"),
    ("reference that fails", r"field 'canonical_solution' \(id 'a2'\): the reference solution "
                             r"fails its own tests \(assertion failed: assert shout\('hi'\)"),
    ("tests that do not parse", r"field 'tests' \(id 'a2'\): not valid Python: line 1"),
    ("no entry point", r"field 'entry_point' \(id 'a2'\): 'not a name' is not a Python function"),
])
def test_a_row_whose_tests_prove_nothing_is_named_by_file_line_and_field(tmp_path, kind, expected):
    rows, scorer = _broken(rows_of(ASSERTS), kind)
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.raises(SpecError, match=rf"t.jsonl:2: {expected}") as caught:
        validate_sets([code_set(path, scorer)])
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


def test_humaneval_tests_declared_as_asserts_are_caught_with_the_fix(tmp_path):
    path = write_jsonl(tmp_path / "he.jsonl", [HUMANEVAL_ROW])
    scorer = dict(HUMANEVAL_SCORER, tests_style="asserts", reference_field=None)
    with pytest.raises(SpecError, match=r"he.jsonl:1: field 'test' \(id 'Mini/0'\): the tests pass "
                                        r"a stub .*set tests_style: humaneval"):
        validate_sets([code_set(path, scorer, id_field="task_id")])


@pytest.mark.parametrize(("style", "tests", "expected"), [
    ("mbpp", "assert f(1) == 2", "tests_style 'mbpp' expects a list of assert statements"),
    ("humaneval", "assert f(1) == 2", "expects tests that define check\\(candidate\\)"),
    ("asserts", ["assert f(1) == 2"], "a list of asserts is tests_style 'mbpp'"),
    ("mbpp", [], "the test list is empty"),
])
def test_a_declared_convention_the_tests_do_not_follow_is_named(style, tests, expected):
    from evalsets.code_tests import UnusableTests

    with pytest.raises(UnusableTests, match=expected):
        build_task(tests, "f", style)


def test_mbpp_tests_that_call_nothing_ask_for_the_entry_point_field(tmp_path):
    rows = rows_of(MBPP)
    rows[2]["test_list"] = ["assert True"]
    path = write_jsonl(tmp_path / "m.jsonl", rows)
    with pytest.raises(SpecError, match=r"m.jsonl:3: field 'test_list' \(id '9001'\): the tests "
                                        r"call no function to test; name it with entry_point_field"):
        validate_sets([code_set(path, MBPP_SCORER, id_field="task_id", prompt_field="text")])
