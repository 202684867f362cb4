from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tests.flows.checkpoints import W8A16, make_emulated_checkpoint
from tests.flows.test_spec import write_spec
from tests.infra.test_cpu_support import AVX2, AVX512

runner = CliRunner()


@pytest.fixture
def cpu(monkeypatch):
    def use(flags):
        monkeypatch.setattr("flows.acceptance.cpu_flags", lambda: flags)
    return use


def emulated_chain(tmp_path):
    """baseline -> dequantized W8A16 -> W8A8 -> fp8 KV: the demo chain."""
    path = write_spec(tmp_path)
    w8 = make_emulated_checkpoint(tmp_path / "models" / "w8a16-dequant", "w8a16", W8A16)
    return path.write_text(path.read_text().replace(str(tmp_path / "models" / "w8a16"), str(w8)))


def test_validate_prints_the_derived_axes(tmp_path, cpu):
    cpu(AVX512)
    emulated_chain(tmp_path)
    result = runner.invoke(app, ["validate", str(tmp_path / "spec.yaml")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "int8/token/dynamic" in result.output and "fp8_e4m3" in result.output
    assert "accuracy gate, 8bit margin -8 pts: power" in result.output


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


def test_validate_refuses_what_this_cpu_cannot_serve(tmp_path, cpu):
    cpu(AVX2)
    emulated_chain(tmp_path)
    result = runner.invoke(app, ["validate", str(tmp_path / "spec.yaml")], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "stage 'kv': vllm-cpu needs AVX-512 or AMX for an fp8 KV cache" in result.output
    cpu(AVX512)
    result = runner.invoke(app, ["validate", str(write_spec(tmp_path))], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "no INT8 weight-only kernel" in result.output


def test_a_crash_is_an_error_never_a_rollback(monkeypatch, capsys):
    import flows.cli as cli

    def crash():
        raise RuntimeError("template broke")

    monkeypatch.setattr(cli, "app", crash)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2  # 1 would read as a rollback verdict
    assert "unexpected RuntimeError: template broke" in capsys.readouterr().err


def test_verdict_reasons_keep_their_bracketed_intervals(capsys):
    from types import SimpleNamespace as NS

    import flows.cli as cli

    check = NS(rule="length", reason="CI [x0.9, x1.0]")  # rich would eat it as a markup tag
    stage = NS(stage="a8", kind="activations", parent="w8", passed=False, failures=[check])
    verdict = NS(candidate="c", decision="rollback", stages=[stage], advisories=["n [x1, x2]"],
                 accepted_stage="baseline", rollback_command="vllm serve m")
    cli.print_verdict(verdict)
    out = capsys.readouterr().out
    assert "[x0.9, x1.0]" in out and "n [x1, x2]" in out
