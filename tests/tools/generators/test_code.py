"""The code set's generator: the committed data.jsonl is what it writes, kinds taken in turn."""

from __future__ import annotations

import json

from tools.generators import code as generate

ROWS = generate.generate()


def test_committed_file_matches_the_generator():
    on_disk = [json.loads(line) for line in generate.DATA_PATH.read_text().splitlines()]
    assert on_disk == ROWS, "data.jsonl is stale: run python -m tools.generators.code"


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
