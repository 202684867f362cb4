"""`quantgate new-evalset` scaffolds a user set that `quantgate validate` accepts as is."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from evalsets.scorers import SCORER_KINDS
from flows.cli import app
from tests.flows.test_cli import emulated_chain
from tests.infra.test_cpu_support import AVX512

runner = CliRunner()


@pytest.fixture
def avx512(monkeypatch):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)


def spec_with(tmp_path, folder):
    """The demo chain's spec with the scaffold's snippet added, as a user would paste it."""
    emulated_chain(tmp_path)
    path = tmp_path / "spec.yaml"
    spec = yaml.safe_load(path.read_text())
    snippet = yaml.safe_load((folder / "spec-snippet.yaml").read_text())
    spec["evalsets"] += snippet.pop("evalsets")
    spec |= snippet  # choice: chat_template false
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("kind", SCORER_KINDS)  # every kind the registry has, instructions too
def test_scaffold_validates_as_is(tmp_path, avx512, kind):
    folder = tmp_path / "tickets"
    result = runner.invoke(app, ["new-evalset", str(folder), "--scorer", kind])
    assert result.exit_code == 0, result.output
    assert "rows pass their contract" in result.output
    assert {p.name for p in folder.iterdir()} == {"data.jsonl", "README.md", "spec-snippet.yaml"}
    assert len((folder / "data.jsonl").read_text().splitlines()) == 120
    assert "quantgate validate" in (folder / "README.md").read_text()
    result = runner.invoke(app, ["validate", str(spec_with(tmp_path, folder))],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output


def test_rows_from_the_users_file(tmp_path, avx512):
    source = tmp_path / "mine.csv"
    source.write_text("id,prompt,answer\n" + "".join(f"{i},What is {i}+{i}?,{2 * i}\n"
                                                     for i in range(100)))
    folder = tmp_path / "arith"
    result = runner.invoke(app, ["new-evalset", str(folder), "--scorer", "numeric",
                                 "--from", str(source)])
    assert result.exit_code == 0, result.output
    assert (folder / "mine.csv").read_text() == source.read_text()
    assert "arith: 100 rows pass" in result.output
    assert runner.invoke(app, ["validate", str(spec_with(tmp_path, folder))]).exit_code == 0


def test_a_bad_row_in_the_users_file_is_named_and_exit_2(tmp_path):
    source = tmp_path / "mine.jsonl"
    source.write_text(json.dumps({"id": 1, "prompt": "p", "answer": 4}) + "\n"
                      + json.dumps({"id": 2, "prompt": "q", "answer": "four"}) + "\n")
    result = runner.invoke(app, ["new-evalset", str(tmp_path / "arith"), "--scorer", "numeric",
                                 "--from", str(source)])
    assert result.exit_code == 2
    assert "mine.jsonl:2: field 'answer' (id '2'): 'four' is not a number" in result.output


def test_unknown_scorer_and_used_folder_are_refused(tmp_path):
    result = runner.invoke(app, ["new-evalset", str(tmp_path / "x"), "--scorer", "exactly"])
    assert result.exit_code == 2 and "did you mean 'exact'" in result.output
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["new-evalset", str(tmp_path / "used"), "--scorer", "exact"])
    assert result.exit_code == 2 and "not empty" in result.output


def test_validate_names_a_broken_row_of_the_scaffold_in_one_line(tmp_path, avx512):
    folder = tmp_path / "tickets"
    assert runner.invoke(app, ["new-evalset", str(folder), "--scorer", "exact"]).exit_code == 0
    data = folder / "data.jsonl"
    lines = data.read_text().splitlines()
    lines[6] = json.dumps(json.loads(lines[6]) | {"prompt": ""})
    data.write_text("\n".join(lines) + "\n")
    result = runner.invoke(app, ["validate", str(spec_with(tmp_path, folder))],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 2
    (line,) = [line for line in result.output.splitlines() if line.strip()]
    assert f"{data}:7: row 7 (id 't006'" in line and "prompt field 'prompt'" in line


def test_help_lists_every_scorer_kind_of_the_registry():
    result = runner.invoke(app, ["new-evalset", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"How its rows are scored: {', '.join(SCORER_KINDS)}." in " ".join(result.output.split())
    assert "instructions" in SCORER_KINDS
