from __future__ import annotations

from typer.testing import CliRunner

from flows.cli import app
from tests.flows.test_spec import write_spec

runner = CliRunner()


def test_validate_prints_the_derived_axes(tmp_path):
    result = runner.invoke(app, ["validate", str(write_spec(tmp_path))], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "int8/token/dynamic" in result.output and "fp8_e4m3" in result.output


def test_invalid_spec_is_one_line_and_exit_2(tmp_path):
    path = write_spec(tmp_path, baseline={"checkpoint": str(tmp_path / "gone")})
    for command in ("validate", "run"):
        result = runner.invoke(app, [command, str(path)])
        assert result.exit_code == 2
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert lines == [f"error: checkpoint {tmp_path / 'gone'} does not exist"], result.output


def test_gate_on_a_folder_without_results_is_exit_2(tmp_path):
    result = runner.invoke(app, ["gate", str(tmp_path)])
    assert result.exit_code == 2 and "no manifest.json" in result.output
