"""User text the CLI prints with rich is printed as written: a checkpoint folder, an idempotency
key, a candidate or a reason that looks like rich markup ("[bold]x[/]", "[/]") is neither read
as markup nor a MarkupError."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from flows.commands.shared import print_verdict
from gates.verdict import Check, StageVerdict, Verdict
from tests.flows.checkpoints import make_checkpoint
from tests.flows.test_bad_inputs import base_spec, tiny_tokenizer
from tests.infra.test_cpu_support import AVX512

MARKUP = ["[bold]x[/]", "[/]", "[red]"]
FOLDERS = ["[bold]x", "[red]", "x[dim]"]  # a folder's name holds no "/": tags that open
runner = CliRunner()


@pytest.mark.parametrize("name", FOLDERS)
def test_validate_prints_a_checkpoint_folder_named_like_markup(tmp_path, monkeypatch, name):
    monkeypatch.setattr("flows.preflight.cpu_flags", lambda: AVX512)
    monkeypatch.setenv("QG_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("QG_REPORTS_DIR", str(tmp_path / "reports"))
    monkeypatch.setenv("QG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    spec = base_spec(tmp_path)
    baseline = make_checkpoint(tmp_path / "models" / name)
    tiny_tokenizer(baseline / "tokenizer.json")
    spec["baseline"]["checkpoint"] = str(baseline)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, (result.output, repr(result.exception))
    assert f" {name} " in result.output, result.output


@pytest.mark.parametrize("text", MARKUP)
def test_the_verdict_table_prints_names_and_reasons_as_written(capsys, monkeypatch, text):
    monkeypatch.setenv("COLUMNS", "300")
    failed = Check(rule="quality.math", passed=False, reason=f"{text} dropped, CI [x0.90, x1.03]")
    verdict = Verdict(candidate=text, decision="rollback", accepted_stage=text,
                      rollback_command=f"vllm serve {text} --api-key sk-live-7f3a9c1e0000",
                      stages=[StageVerdict(stage=text, kind="weights", parent="baseline",
                                           passed=False, checks=[failed])],
                      advisories=[f"{text} was not established"])
    print_verdict(verdict)
    out = capsys.readouterr().out
    assert f"{text}: ROLLBACK" in out and f"{text} dropped, CI [x0.90, x1.03]" in out, out
    assert f"rollback to stage {text}:" in out and f"vllm serve {text}" in out, out
    assert f"not established: {text} was not established" in out, out
    assert "sk-live-7f3a9c1e0000" not in out


def test_submit_prints_the_key_it_was_given_as_written(tmp_path, monkeypatch):
    key = "[bold]nightly[/]"
    monkeypatch.setenv("QG_STATE_DIR", str(tmp_path))
    monkeypatch.setattr("flows.service.use_service", lambda *args, **kwargs: {})
    monkeypatch.setattr("flows.preflight.Prepared", lambda *args, **kwargs: None)
    monkeypatch.setattr("flows.service.submit", lambda spec, key, no_cache: (
        "0b1d", f"already submitted as {key} (scheduled)"))
    result = runner.invoke(app, ["submit", str(tmp_path / "spec.yaml"), "--key", key],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 0, (result.output, repr(result.exception))
    assert f"0b1d already submitted as {key} (scheduled)" in result.output


def test_register_prints_a_model_name_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QG_STATE_DIR", str(tmp_path / ".quantgate"))
    for name in ("MLFLOW_TRACKING_URI", "QG_MLFLOW_TRACKING_URI", "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)
    checkpoint = make_checkpoint(Path(tmp_path) / "ckpt")
    result = runner.invoke(app, ["register", "[bold]m", str(checkpoint)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, (result.output, repr(result.exception))
    assert "[bold]m version 1:" in result.output
