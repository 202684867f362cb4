"""The report's flipped items show a user set's prompts, read from the user's own file."""

from __future__ import annotations

import json

from evalsets.spec import EvalSetSpec
from gates.report import flipped_items
from tests.gates.records import record


def test_flips_of_a_user_set_show_its_prompts(tmp_path):
    data = tmp_path / "tickets.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt": f"Ticket {i}: route it", "answer": "a"})
                            + "\n" for i in range(4)))
    EvalSetSpec(name="tickets", path=data, scorer={"kind": "exact"})  # the spec is read
    records = [record("baseline", None, [1.0, 1.0, 0.0, 0.0]),
               record("w8", "baseline", [1.0, 0.0, 0.0, 1.0])]
    for stage in records:
        task = stage.quality.tasks.pop("math")
        stage.quality.tasks["tickets"] = task.model_copy(update={"task": "tickets"})
    (stage,) = flipped_items(records)
    flips = stage["rows"]
    assert [(f["set"], f["id"], f["direction"], f["prompt"]) for f in flips] == [
        ("tickets", "1", "correct->wrong", "Ticket 1: route it"),
        ("tickets", "3", "wrong->correct", "Ticket 3: route it"),
    ]
    assert flips[0]["stage_response"] == "w8 answer 1"
