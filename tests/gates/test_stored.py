"""Stored records are read back only when this quantgate knows their layout and the folder is whole."""

from __future__ import annotations

import json
import shutil

import pytest

from gates.decide import load_records
from gates.record import SCHEMA_VERSION, RunManifest, StageRecord, StoredRecordError
from infra.errors import QuantgateError
from tests.gates.records import record

SCORES = [1.0] * 10 + [0.0] * 10


def stored_run(folder, stages=("baseline", "w")):
    for name in stages:
        record(name, None if name == "baseline" else "baseline", SCORES).save(folder / name)
    RunManifest(candidate="c", stages=list(stages)).save(folder)
    return folder


def edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_records_carry_the_schema_version_and_read_back(tmp_path):
    run = stored_run(tmp_path)
    assert json.loads((run / "w" / "stage.json").read_text())["schema_version"] == SCHEMA_VERSION
    assert json.loads((run / "manifest.json").read_text())["schema_version"] == RunManifest.LAYOUT
    candidate, records = load_records(run)
    assert candidate == "c" and [r.name for r in records] == ["baseline", "w"]


def test_a_record_written_before_the_version_field_reads_as_layout_1(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "manifest.json", lambda data: data.pop("schema_version"))
    # Layout 1: no version field, the stage's results inside stage.json, no files of their own.
    stored = StageRecord.read(run / "w")
    layout_1 = stored.model_dump(mode="json", exclude={"schema_version"})
    shutil.rmtree(run / "w")
    (run / "w").mkdir()
    (run / "w" / "stage.json").write_text(json.dumps(layout_1))
    _, records = load_records(run)
    assert records[1].schema_version == 1
    assert records[1].quality is not None and records[1].load is not None
    assert records[1].model_dump(exclude={"schema_version"}) == stored.model_dump(
        exclude={"schema_version"})


def test_each_result_is_stored_once_in_its_own_file(tmp_path):
    run = stored_run(tmp_path)
    stage = json.loads((run / "w" / "stage.json").read_text())
    assert "quality" not in stage and "load" not in stage and "paired_load" not in stage
    assert stage["results"] == {"quality": "quality/quality.json", "load": "load/load.json",
                                "paired_load": None}
    quality = json.loads((run / "w" / "quality" / "quality.json").read_text())
    assert quality["schema_version"] == 1 and quality["tasks"]
    written = record("w", "baseline", SCORES)
    _, records = load_records(run)
    assert records[1].quality.model_dump() == written.quality.model_dump()
    assert records[1].load.model_dump() == written.load.model_dump()


@pytest.mark.parametrize(("file", "layout"), [("manifest.json", RunManifest.LAYOUT),
                                              ("w/stage.json", SCHEMA_VERSION),
                                              ("w/quality/quality.json", 1)])
def test_a_newer_layout_is_refused_with_the_version_and_upgrade(tmp_path, file, layout):
    run = stored_run(tmp_path)
    edit(run / file, lambda data: data.update(schema_version=layout + 2))
    with pytest.raises(StoredRecordError) as raised:
        load_records(run)
    assert str(raised.value) == (
        f"{run / file}: written by a newer quantgate (schema {layout + 2}, this one "
        f"reads {layout}): upgrade quantgate to gate it")
    assert isinstance(raised.value, QuantgateError)


def test_a_nonsense_version_is_refused(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "w" / "stage.json", lambda data: data.update(schema_version="one"))
    with pytest.raises(StoredRecordError, match=r"stage\.json: unknown schema version 'one'"):
        load_records(run)


def test_a_changed_layout_is_named_damaged_or_older(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "w" / "stage.json", lambda data: data.pop("axes"))
    with pytest.raises(StoredRecordError, match=r"w/stage\.json: schema 2 but not a valid "
                       r"StageRecord \(axes: Field required\); damaged or older layout"):
        load_records(run)


@pytest.mark.parametrize("content", ["{\"name\": ", "[1, 2]", b"\xff\xfe"])
def test_a_damaged_file_is_refused(tmp_path, content):
    run = stored_run(tmp_path)
    path = run / "w" / "stage.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(StoredRecordError, match=r"stage\.json: .*damaged"):
        load_records(run)


def test_a_missing_stage_folder_is_refused(tmp_path):
    run = stored_run(tmp_path)
    (run / "w" / "stage.json").unlink()
    with pytest.raises(StoredRecordError, match=r"w/stage\.json: missing"):
        load_records(run)


@pytest.mark.parametrize("entry", ["../other-run/w", "/tmp/w", "sub/w", "..", ".", ""])
def test_a_manifest_entry_outside_the_run_is_refused(tmp_path, entry):
    other = stored_run(tmp_path / "other-run")  # a real stage the entry could reach
    run = stored_run(tmp_path / "run")
    edit(run / "manifest.json", lambda data: data.update(stages=["baseline", entry]))
    assert (other / "w" / "stage.json").is_file()
    with pytest.raises(StoredRecordError, match=r"stage entry .* is not a stage folder of this run"):
        load_records(run)


def test_a_manifest_without_stages_is_refused(tmp_path):
    run = stored_run(tmp_path)
    edit(run / "manifest.json", lambda data: data.update(stages=[]))
    with pytest.raises(StoredRecordError, match="lists no stages"):
        load_records(run)
