"""The report's flipped items show a user set's prompts, read from the user's own file."""

from __future__ import annotations

import json

from evalsets.spec import EvalSetSpec
from gates.report import flipped_items, set_prompts
from tests.gates.records import record


def test_flips_of_a_user_set_show_its_prompts(tmp_path):
    data = tmp_path / "tickets.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt": f"Ticket {i}: route it", "answer": "a"})
                            + "\n" for i in range(4)))
    tickets = EvalSetSpec(name="tickets", path=data, scorer={"kind": "exact"})
    records = [record("baseline", None, [1.0, 1.0, 0.0, 0.0]),
               record("w8", "baseline", [1.0, 0.0, 0.0, 1.0])]
    for stage in records:
        task = stage.quality.tasks.pop("math")
        stage.quality.tasks["tickets"] = task.model_copy(update={"task": "tickets"})
    assert all(row["prompt"].startswith("(prompt not stored") for row in
               flipped_items(records)[0]["rows"])  # a user set read in this process: no global
    (stage,) = flipped_items(records, set_prompts({"tickets": tickets.info}))
    flips = stage["rows"]
    assert [(f["set"], f["id"], f["direction"], f["prompt"]) for f in flips] == [
        ("tickets", "1", "correct->wrong", "Ticket 1: route it"),
        ("tickets", "3", "wrong->correct", "Ticket 3: route it"),
    ]
    assert flips[0]["stage_response"] == "w8 answer 1"


def test_gate_report_of_a_run_without_kept_inputs_reads_its_spec_again(tmp_path):
    import yaml

    from flows.commands.results import _spec_prompts
    from gates.record import RunManifest
    from tests.flows.test_spec import write_spec

    data = tmp_path / "tickets.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt": f"Ticket {i}: route it", "answer": "a"})
                            + "\n" for i in range(80)))
    path = write_spec(tmp_path, evalsets=[{"name": "tickets", "path": "tickets.jsonl",
                                           "scorer": {"kind": "exact"}, "limit": 80}])
    assert yaml.safe_load(path.read_text())["evalsets"][0]["path"] == "tickets.jsonl"
    results = tmp_path / "runs" / "demo-1"
    RunManifest(candidate="demo", stages=["baseline"], spec_path=str(path)).save(results)
    assert _spec_prompts(results)("tickets")["7"] == "Ticket 7: route it"
    path.unlink()  # the spec is gone: the report goes on without it, showing hashes
    assert _spec_prompts(results)("tickets") == {}
