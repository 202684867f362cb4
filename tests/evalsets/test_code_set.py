"""The code set: its committed data, every canonical solution passes its own tests in the
sandbox, code is found in the ways a chat model writes it, and the lm-eval hook scores pass@1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalsets.code.grading import extract_code, process_results
from evalsets.sandbox import run_untrusted
from evalsets.spec import EvalSetSpec, registry

DATA_PATH = Path(__file__).resolve().parents[2] / "evalsets/code/data.jsonl"
ROWS = [json.loads(line) for line in DATA_PATH.read_text().splitlines()]


def test_enough_tasks_with_unique_ids_and_entry_points():
    assert len(ROWS) >= 150
    assert len({row["id"] for row in ROWS}) == len(ROWS)
    assert len({row["entry_point"] for row in ROWS}) == len(ROWS)
    for row in ROWS:
        assert row["tests"].count("assert ") >= 3
        assert f"`{row['entry_point']}(" in row["prompt"]


@pytest.mark.parametrize("row", ROWS, ids=[row["entry_point"] for row in ROWS])
def test_canonical_solution_passes_in_the_sandbox(row):
    result = run_untrusted(row["canonical_solution"], row["tests"])
    assert result.passed, result.reason


def test_a_wrong_solution_fails():
    add = next(row for row in ROWS if row["entry_point"] == "add")
    assert process_results(add, ["```python\ndef add(a, b):\n    return a * b\n```"]) == {"pass_at_1": 0.0}
    assert process_results(add, ["```python\ndef add(a, b):\n    return a + b\n```"]) == {"pass_at_1": 1.0}


ADD = "def add(a, b):\n    return a + b\n"


@pytest.mark.parametrize(
    "response",
    [
        f"```python\n{ADD}```",
        f"Here is the function:\n\n```python\n{ADD}```\n\nIt adds the numbers.",
        f"```\n{ADD}```",
        f"```py\n{ADD}",  # cut off by the token budget before the closing fence
        f"```python\nprint(add(1, 2))\n```\n```python\n{ADD}```",  # the block defining it wins
        f"Sure!\n\n{ADD}\nThis returns the sum.",
        ADD,
    ],
)
def test_extract_code(response):
    assert extract_code(response, "add").strip() == ADD.strip()


def test_registered_and_configured_for_greedy_pass_at_1():
    from evalsets.runner import load_task_config, primary_metric

    assert "code" in registry()
    config = load_task_config(EvalSetSpec(name="code", limit=3))
    assert primary_metric(config) == "pass_at_1"
    assert config["generation_kwargs"]["do_sample"] is False
    assert config["generation_kwargs"]["temperature"] == 0.0
    add = next(row for row in ROWS if row["entry_point"] == "add")
    assert config["process_results"](add, [f"```python\n{ADD}```"]) == {"pass_at_1": 1.0}
