"""The stage cache key holds a user set's content: one changed row changes every stage's key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.cache import digest, stage_keys
from flows.plan import plan
from flows.spec import Spec
from tests.flows.checkpoints import W8A16, make_checkpoint


@pytest.fixture(autouse=True)
def digest_store(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def keys(tmp_path: Path, evalset: dict) -> dict[str, str]:
    for name, config in (("bf16", None), ("w8", W8A16)):
        if not (tmp_path / name).exists():
            make_checkpoint(tmp_path / name, *([config] if config else []))
    spec = Spec.model_validate({
        "candidate": "c", "baseline": {"checkpoint": str(tmp_path / "bf16")},
        "stages": [{"name": "w8", "kind": "weights", "checkpoint": str(tmp_path / "w8")}],
        "evalsets": [{"name": "math", "limit": 40}, evalset],
    }, context={"base_dir": tmp_path})
    parts = stage_keys(plan(spec), spec, {"requests": 12}, {}, 64)
    return {name: digest(part) for name, part in parts.items()}


def test_a_changed_row_of_a_user_file_changes_the_keys(tmp_path):
    data = tmp_path / "t.jsonl"
    rows = [{"id": i, "prompt": f"q{i}", "answer": "a"} for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    evalset = {"name": "tickets", "path": "t.jsonl", "scorer": {"kind": "exact"}}
    before = keys(tmp_path, evalset)
    assert keys(tmp_path, evalset) == before
    rows[1]["answer"] = "b"  # same size, one row different
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    after = keys(tmp_path, evalset)
    assert after["baseline"] != before["baseline"] and after["w8"] != before["w8"]


def test_a_changed_file_in_a_user_task_folder_changes_the_keys(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "task.yaml").write_text("task: mine\n")
    (folder / "data.jsonl").write_text('{"id": 1, "question": "q", "answer": "a"}\n')
    evalset = {"name": "mine", "path": "mine"}
    before = keys(tmp_path, evalset)
    (folder / "data.jsonl").write_text('{"id": 1, "question": "q", "answer": "b"}\n')
    assert keys(tmp_path, evalset)["baseline"] != before["baseline"]
