"""Commands that only read an MLflow store, or refuse their input, write nothing: no store is
created in passing, and what MLflow refuses is one line, exit 2."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tests.flows.checkpoints import make_checkpoint

runner = CliRunner()


def files(folder: Path) -> set[Path]:
    return {path.relative_to(folder) for path in folder.rglob("*")}


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    """An empty working folder, no service and no store named: the default store is sqlite here."""
    monkeypatch.chdir(tmp_path)
    for name in ("MLFLOW_TRACKING_URI", "QG_MLFLOW_TRACKING_URI", "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("QG_STATE_DIR", str(tmp_path / ".quantgate"))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    return tmp_path


def one_line(args: list[str], env: dict[str, str] | None = None) -> str:
    started = time.monotonic()
    result = runner.invoke(app, args, env={"COLUMNS": "400"} | (env or {}))
    assert time.monotonic() - started < 30, "MLflow was left to retry"
    assert result.exit_code == 2, (result.output, repr(result.exception))
    lines = [line for line in result.output.splitlines()
             if line.strip() and "INFO mlflow" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.mark.parametrize("args", [["promote", "m", "1"], ["rollback", "m"], ["compare"],
                                  ["compare", "c"]])
def test_a_command_that_reads_a_store_that_is_not_there_creates_none(here, args):
    line = one_line(args)
    assert f"no MLflow store there ({here / 'mlflow.db'} does not exist)" in line, line
    assert files(here) == set()


def test_a_named_sqlite_store_that_is_not_there_is_not_created_either(here):
    store = here / "elsewhere" / "mlflow.db"
    store.parent.mkdir()
    line = one_line(["promote", "m", "1"], env={"MLFLOW_TRACKING_URI": f"sqlite:///{store}"})
    assert line.startswith(f"error: MLFLOW_TRACKING_URI=sqlite:///{store}: no MLflow store there")
    assert files(here) == {Path("elsewhere")}


@pytest.mark.parametrize(("make", "expected"), [
    (lambda folder: folder / "gone", "does not exist"),
    (lambda folder: (folder / "empty").mkdir() or folder / "empty",
     "is not a model: no config.json"),
])
def test_register_of_a_refused_path_writes_nothing(here, make, expected):
    checkpoint = make(here)
    before = files(here)
    line = one_line(["register", "m", str(checkpoint)])
    assert line == (f"error: checkpoint {checkpoint} {expected}; give register the folder of a "
                    "checkpoint (its config.json and weight files)"), line
    assert files(here) == before


@pytest.mark.parametrize(("model", "expected"), [
    ("team/model", "model name 'team/model': MLflow refuses it (Invalid model name 'team/model'. "
     "Names cannot contain '/' or ':'); choose a non-empty name without '/' or ':', such as "
     "'team-model'"),
    ("..", "model name '..': MLflow refuses it (Invalid value \"..\""),
])
def test_a_model_name_mlflow_refuses_is_one_line_and_writes_nothing(here, model, expected):
    checkpoint = make_checkpoint(here / "ckpt")
    before = files(here)
    for args in (["register", model, str(checkpoint)], ["promote", model, "1"]):
        line = one_line(args)
        assert line.startswith(f"error: {expected}"), line
    assert files(here) == before


@pytest.mark.parametrize(("uri", "expected"), [
    ("foo://bar", "MLflow store foo://bar: Model registry functionality is unavailable; got "
     "unsupported URI 'foo://bar'"),
    ("file://{here}/mlruns", "MLflow store file://{here}/mlruns: The filesystem tracking backend"),
    ("http://127.0.0.1:1", "MLFLOW_TRACKING_URI=http://127.0.0.1:1: the MLflow server does not "
     "answer"),
])
def test_compare_on_a_store_mlflow_cannot_read_is_one_line(here, uri, expected):
    uri, expected = uri.format(here=here), expected.format(here=here)
    line = one_line(["compare"], env={"MLFLOW_TRACKING_URI": uri})
    assert line.startswith(f"error: {expected}"), line
    assert files(here) == set()


def test_registry_commands_on_a_store_mlflow_cannot_open_are_one_line(here):
    line = one_line(["rollback", "m"], env={"MLFLOW_TRACKING_URI": "foo://bar"})
    assert line.startswith("error: MLFLOW_TRACKING_URI=foo://bar: MLflow cannot open it (Model "
                           "registry functionality is unavailable"), line


def test_register_creates_the_store_it_writes_to(here):
    """Register writes: it may make the default store; promote then moves its alias."""
    result = runner.invoke(app, ["register", "m", str(make_checkpoint(here / "ckpt"))])
    assert result.exit_code == 0, (result.output, repr(result.exception))
    assert "m version 1:" in result.output and (here / "mlflow.db").is_file()
    result = runner.invoke(app, ["promote", "m", "1"])
    assert result.exit_code == 0 and ", promote, none->v1, " in result.output, result.output


@pytest.mark.parametrize(("content", "problem"), [
    (b"", "holds no MLflow store (no experiments table), and opening it would write MLflow's "
          "tables into it"),
    (b"not a database", "is not an SQLite database (file is not a database)"),
])
@pytest.mark.parametrize("args", [["compare"], ["promote", "m", "1"], ["rollback", "m"]])
def test_a_file_that_is_no_mlflow_store_is_left_as_it_is(here, content, problem, args):
    store = here / "mlflow.db"
    store.write_bytes(content)
    line = one_line(args)
    assert line == (f"error: MLFLOW_TRACKING_URI=sqlite:///{store}: {store} {problem}; set "
                    "MLFLOW_TRACKING_URI (or QG_MLFLOW_TRACKING_URI) to the MLflow store "
                    "(sqlite:///<path to mlflow.db>)"), line
    assert store.read_bytes() == content and files(here) == {Path("mlflow.db")}
