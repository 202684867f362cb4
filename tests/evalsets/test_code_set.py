"""The code set: data from its generator, every canonical solution passes its own tests in the
sandbox, code is found in the ways a chat model writes it, and the lm-eval hook scores pass@1."""

from __future__ import annotations

import json

import pytest

from evalsets.code import generate
from evalsets.code.grading import extract_code, process_results
from evalsets.sandbox import run_untrusted
from evalsets.spec import EvalSetSpec, registry

ROWS = generate.generate()


def test_committed_file_matches_the_generator():
    on_disk = [json.loads(line) for line in generate.DATA_PATH.read_text().splitlines()]
    assert on_disk == ROWS, "data.jsonl is stale: run python -m evalsets.code.generate"


def test_enough_tasks_with_unique_ids_and_entry_points():
    assert len(ROWS) >= 150
    assert len({row["id"] for row in ROWS}) == len(ROWS)
    assert len({row["entry_point"] for row in ROWS}) == len(ROWS)
    for row in ROWS:
        assert row["tests"].count("assert ") >= 3
        assert f"`{row['entry_point']}(" in row["prompt"]


def test_first_sixty_keep_their_ids_and_the_rest_take_the_kinds_in_turn():
    assert [row["entry_point"] for row in ROWS[:60]] == [t.entry_point for t in generate.FIRST_TASKS]
    assert ROWS[0]["id"] == "code-0000" and ROWS[0]["entry_point"] == "add"
    kinds = [generate.NUMBER_TASKS, generate.TEXT_TASKS, generate.LIST_TASKS, generate.MAPPING_TASKS]
    kind_of = {task.entry_point: number for number, tasks in enumerate(kinds) for task in tasks}
    later = [kind_of[row["entry_point"]] for row in ROWS[60:]]
    assert len(later) == len(ROWS) - 60 >= 90
    shortest = min(len(tasks) for tasks in kinds)
    assert later[: 4 * shortest] == [0, 1, 2, 3] * shortest
    assert all(len(tasks) >= 20 for tasks in kinds)


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
