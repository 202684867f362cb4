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


def test_gate_report_in_a_fresh_process_finds_the_runs_user_sets(tmp_path, monkeypatch):
    import yaml

    from evalsets import spec as evalset_spec
    from flows.commands.results import _read_run_spec
    from gates.record import RunManifest
    from tests.flows.test_spec import write_spec

    data = tmp_path / "tickets.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt": f"Ticket {i}: route it", "answer": "a"})
                            + "\n" for i in range(80)))
    path = write_spec(tmp_path, evalsets=[{"name": "tickets", "path": "tickets.jsonl",
                                           "scorer": {"kind": "exact"}, "limit": 80}])
    assert yaml.safe_load(path.read_text())["evalsets"][0]["path"] == "tickets.jsonl"
    monkeypatch.setattr(evalset_spec, "_USER_SETS", {})  # a fresh process knows no user set
    results = tmp_path / "runs" / "demo-1"
    RunManifest(candidate="demo", stages=["baseline"], spec_path=str(path)).save(results)
    _read_run_spec(results)
    assert evalset_spec.find_evalset("tickets").data_file == data
    path.unlink()  # the spec is gone: the report goes on without it
    monkeypatch.setattr(evalset_spec, "_USER_SETS", {})
    _read_run_spec(results)
    assert evalset_spec.find_evalset("tickets") is None
