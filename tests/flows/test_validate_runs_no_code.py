"""`validate` reads a task folder's code as text: its `!function`s and its contract's `check` are
checked with `ast` (file, parse, function), never imported; `run` still imports them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from tests.flows.test_bad_inputs import base_spec, external
from tests.infra.test_cpu_support import AVX512

runner = CliRunner()
BUSINESS = Path(__file__).parents[2] / "evalsets" / "business"
PLANT = "import pathlib\npathlib.Path({marker!r}).write_text('imported')\n"


def user_set(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the business set as a user folder whose grading.py leaves a file when imported."""
    folder = tmp_path / "myset"
    shutil.copytree(BUSINESS, folder)
    marker = tmp_path / "IMPORTED"
    source = (folder / "grading.py").read_text()
    head = "from __future__ import annotations\n"
    (folder / "grading.py").write_text(source.replace(head, head + PLANT.format(marker=str(marker)), 1))
    spec = base_spec(tmp_path)
    spec["evalsets"] = [{"name": "mine", "path": str(folder)}]
    external(spec)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    return folder, marker


def validate(tmp_path: Path):
    result = runner.invoke(app, ["validate", str(tmp_path / "spec.yaml")], env={"COLUMNS": "300"})
    return result, [line for line in result.output.splitlines() if line.strip()]


def test_validate_imports_no_code_of_a_user_folder(tmp_path, monkeypatch):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    _, marker = user_set(tmp_path)
    result, _ = validate(tmp_path)
    assert result.exit_code == 0, result.output
    assert not marker.exists()


def test_a_run_still_imports_the_folders_row_check(tmp_path, monkeypatch):
    from flows.preflight import Prepared

    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    _, marker = user_set(tmp_path)
    Prepared(tmp_path / "spec.yaml", run_checks=True)
    assert marker.read_text() == "imported"


@pytest.mark.parametrize("file, old, new, expected", [
    ("task.yaml", "grading.process_results", "grading.process_resultz",
     "process_results: 'grading.process_resultz': {folder}/grading.py defines no 'process_resultz' "
     "at its top level; did you mean 'process_results'?"),
    ("task.yaml", "grading.process_results", "nomodule.fn",
     "process_results: 'nomodule.fn': no nomodule.py in {folder} and no installed module"),
    ("task.yaml", "grading.process_results", "process_results",
     "'process_results' is not module.function"),
    ("contract.yaml", "check: grading.load_items", "check: grading.load_itemz",
     "contract.yaml: check: 'grading.load_itemz': {folder}/grading.py defines no 'load_itemz'"),
    ("contract.yaml", "check: grading.load_items", "check: checks.load_items",
     "check 'checks.load_items': no checks.py in the folder"),
    ("grading.py", "def score(", "def score((",
     "{folder}/grading.py does not parse as Python (line"),
])
def test_a_broken_code_reference_is_one_line(tmp_path, monkeypatch, file, old, new, expected):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    folder, marker = user_set(tmp_path)
    path = folder / file
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))
    result, lines = validate(tmp_path)
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert expected.format(folder=folder) in lines[0]
    assert not marker.exists()


def test_an_installed_module_is_found_without_importing_it(tmp_path):
    from evalsets.task_code import check_reference

    check_reference(tmp_path, "json.loads", "here")  # on sys.path, a .py file: read, not run
    check_reference(tmp_path, "math.sqrt", "here")  # a compiled module: its existence suffices
    with pytest.raises(Exception, match="defines no 'nope'"):
        check_reference(tmp_path, "json.nope", "here")


@pytest.mark.parametrize("included, expected", [
    ("process_docs: !function grading.nope\n",
     "base.yaml: process_docs: 'grading.nope': {folder}/grading.py defines no 'nope'"),
    ("include: task.yaml\n", "base.yaml: include 'task.yaml' includes itself again (a cycle)"),
], ids=["a function of an included file", "an include cycle"])
def test_included_task_files_are_read_as_data_too(tmp_path, monkeypatch, included, expected):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    folder, marker = user_set(tmp_path)
    (folder / "base.yaml").write_text(included)
    task = folder / "task.yaml"
    task.write_text("include: base.yaml\n" + task.read_text())
    result, lines = validate(tmp_path)
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and expected.format(folder=folder) in lines[0], result.output
    assert not marker.exists()
