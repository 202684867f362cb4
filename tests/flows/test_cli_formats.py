from typer.testing import CliRunner

from flows.cli import app
from tests.flows.test_cli import stored_run

runner = CliRunner()


def test_formats_prints_the_table_and_judges_each_ordering(tmp_path):
    result = runner.invoke(app, ["formats", str(stored_run(tmp_path / "run"))],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "ppl_ratio" in result.output and "acc.math" in result.output
    assert "FP4: NVFP4 (group 16, FP8 scales) < MXFP4 (group 32, E8M0 scales): not judged" in \
        result.output


def test_an_unknown_format_is_one_line_naming_the_known_ones(tmp_path):
    result = runner.invoke(app, ["prepare-candidates", "nvfp5", "--models-dir", str(tmp_path)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1
    assert "unknown format 'nvfp5' (did you mean 'nvfp4'?); known formats: nvfp4, mxfp4" in lines[0]
