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
        monkeypatch.setattr("flows.preflight.cpu_flags", lambda: flags)
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

    from flows.commands import shared
    from gates.verdict import RollbackPlan

    check = NS(rule="length", reason="CI [x0.9, x1.0]")  # rich would eat it as a markup tag
    stage = NS(stage="a8", kind="activations", parent="w8", passed=False, failures=[check])
    repair = NS(repairs="a8", stage="a8-repair", configuration="int8/channel", decision="go",
                reasons=["a8-repair: length: x1.2 [x1.1, x1.3]"])
    verdict = NS(candidate="c", decision="rollback", stages=[stage], advisories=["n [x1, x2]"],
                 accepted_stage="baseline", rollback_command="vllm serve m", repairs=[repair],
                 rollback_plan=RollbackPlan(stage="baseline", command="vllm serve m",
                                            passed_emulated=["w8"]))
    shared.print_verdict(verdict)
    out = capsys.readouterr().out
    assert "[x0.9, x1.0]" in out and "n [x1, x2]" in out
    assert "(stage w8 passed but served dequantized (emulated) weights" in " ".join(out.split())
    assert "repair of a8: stage a8-repair (int8/channel): GO" in out and "[x1.1, x1.3]" in out


def error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.strip()]


@pytest.mark.parametrize("where", ["spec", "policy", "profile"])
def test_a_repeated_yaml_key_is_one_line_naming_key_and_line(tmp_path, cpu, where):
    cpu(AVX512)
    emulated_chain(tmp_path)
    spec = tmp_path / "spec.yaml"
    if where == "spec":
        target = spec
        spec.write_text(spec.read_text() + "stages: []\n")  # would silently drop the stages
    else:
        target = tmp_path / f"{where}.yaml"
        target.write_text("first: 1\nsecond:\n  inner: 2\n  inner: 3\n")
        field = "gate_policy" if where == "policy" else "load_profile"
        spec.write_text(spec.read_text().replace(
            "load_profile: ci\n", f"load_profile: ci\n{field}: {target}\n"
            if where == "policy" else f"load_profile: {target}\n"))
    result = runner.invoke(app, ["validate", str(spec)], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith(f"error: {target}: duplicate key"), result.output
    key, line = ("stages", "line") if where == "spec" else ("inner", "line 4")
    assert f"'{key}' at {line}" in lines[0]


def test_a_spec_that_is_not_utf8_is_one_line(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_bytes("candidate: d\xe9mo\n".encode("latin-1"))
    result = runner.invoke(app, ["validate", str(spec)])
    assert result.exit_code == 2
    assert error_lines(result) == [error_lines(result)[0]]
    assert error_lines(result)[0].startswith(f"error: {spec}: not UTF-8"), result.output


def test_bracketed_values_survive_in_error_messages(tmp_path):
    path = write_spec(tmp_path, stages=[{"name": "[x]", "kind": "kv_cache",
                                         "engine_flags": {"kv_cache_dtype": "fp8"}}])
    result = runner.invoke(app, ["validate", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert len(error_lines(result)) == 1, result.output
    assert "^[a-z0-9][a-z0-9_-]*$" in result.output and "'[x]'" in result.output, result.output


def stored_run(folder):
    from gates.record import RunManifest
    from tests.gates.records import record

    scores = [1.0] * 30 + [0.0] * 30
    for name, parent in (("baseline", None), ("w", "baseline")):
        record(name, parent, scores).save(folder / name)
    RunManifest(candidate="c", stages=["baseline", "w"]).save(folder)
    return folder


@pytest.mark.parametrize(("damage", "expected"), [
    ({"schema_version": 3}, "written by a newer quantgate (schema 3, this one reads 1): upgrade"),
    ({"stages": ["baseline", "../other-run/w"]}, "stage entry '../other-run/w' is not a stage "
     "folder of this run"),
])
def test_gate_refuses_a_manifest_it_cannot_trust_with_exit_2(tmp_path, damage, expected):
    import json

    stored_run(tmp_path / "other-run")
    run = stored_run(tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps(manifest | damage))
    result = runner.invoke(app, ["gate", str(run)], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output  # never 0 (go) nor 1 (rollback)
    assert len(error_lines(result)) == 1 and expected in result.output, result.output


@pytest.mark.parametrize("damage", [
    lambda data: data | {"schema_version": 7},
    lambda data: {k: v for k, v in data.items() if k != "quality"} | {"quality": "gone"},
])
def test_gate_on_an_unknown_or_damaged_stage_is_exit_2(tmp_path, damage):
    import json

    run = stored_run(tmp_path)
    path = run / "w" / "stage.json"
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    result = runner.invoke(app, ["gate", str(run)], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:"), result.output


def test_gate_report_never_replaces_a_report_unless_forced(tmp_path):
    run = stored_run(tmp_path / "run")
    signed = tmp_path / "signed"
    signed.mkdir()
    (signed / "report.html").write_text("signed by alice")
    result = runner.invoke(app, ["gate", str(run), "--report", str(signed)], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert error_lines(result) == [f"error: {signed} already holds a report (report.html); choose "
                                   "a new folder or pass --force to overwrite it"]
    assert (signed / "report.html").read_text() == "signed by alice"
    result = runner.invoke(app, ["gate", str(run), "--report", str(signed), "--force"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "<html" in (signed / "report.html").read_text().lower()


@pytest.mark.parametrize(("variable", "value"), [
    ("QG_RESULTS_DIR", "{blocker}/runs"),
    ("QG_REPORTS_DIR", "{blocker}/reports"),
    ("MLFLOW_TRACKING_URI", "sqlite:///{blocker}/db/mlflow.db"),
])
def test_run_refuses_an_unwritable_setting_before_measuring(tmp_path, cpu, monkeypatch, variable,
                                                            value):
    cpu(AVX512)
    emulated_chain(tmp_path)
    blocker = tmp_path / "a-file"  # a folder under a file: unwritable even for root
    blocker.write_text("")

    def measured(*args, **kwargs):
        raise AssertionError("the run started")

    monkeypatch.setattr("flows.acceptance.acceptance", measured)
    monkeypatch.delenv("QG_MLFLOW_TRACKING_URI", raising=False)
    result = runner.invoke(app, ["run", str(tmp_path / "spec.yaml")],
                           env={"COLUMNS": "200", variable: value.format(blocker=blocker)})
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith(f"error: {variable}"), result.output
    assert f"set {variable} to a writable location" in lines[0]


def test_a_crash_says_where_results_are_only_when_there_are_some(tmp_path, monkeypatch, capsys):
    import flows.cli as cli

    def crash():
        raise RuntimeError("template [broke]")

    monkeypatch.setattr(cli, "app", crash)
    monkeypatch.setenv("QG_RESULTS_DIR", str(tmp_path / "runs"))
    with pytest.raises(SystemExit):
        cli.main()
    err = capsys.readouterr().err
    assert "template [broke]" in err and "kept under" not in err
    (tmp_path / "runs" / "demo-1").mkdir(parents=True)
    with pytest.raises(SystemExit):
        cli.main()
    assert f"measured results are kept under {tmp_path / 'runs'}" in capsys.readouterr().err


def test_an_environment_oserror_is_one_line_not_a_bug(monkeypatch, capsys):
    import flows.cli as cli

    def full_disk():
        raise OSError(28, "No space left on device", "/data/runs/x/stage.json")

    monkeypatch.setattr(cli, "app", full_disk)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "No space left on device (/data/runs/x/stage.json)" in lines[0]
    assert "not a bug" in lines[0]


def test_a_bad_setting_is_one_line_naming_the_variable():
    result = runner.invoke(app, ["compare"], env={"QG_NUM_CONCURRENT": "many"})
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert len(lines) == 1 and lines[0].startswith("error: invalid setting: QG_NUM_CONCURRENT"), lines
    assert "'many'" in lines[0]


def test_tables_off_a_terminal_are_not_folded(tmp_path, cpu, monkeypatch):
    # A CI log: no terminal, no COLUMNS. Rich's 80 columns folded "activatio / ns".
    from flows.commands import running, shared

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(running, "console", shared._console())  # where `validate` prints
    assert running.console.width == shared.PLAIN_WIDTH
    cpu(AVX512)
    emulated_chain(tmp_path)
    result = runner.invoke(app, ["validate", str(tmp_path / "spec.yaml")])
    assert result.exit_code == 0, result.output
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in result.output.splitlines()]
    assert ["activations", "activations", "weights", "int8/channel", "int8/token/dynamic", "auto",
            "w8a8"] in cells, result.output  # one row, no cell folded onto a second line


def test_the_console_reads_its_width_at_each_print(monkeypatch, capsys):
    # Read once, where the console was made, COLUMNS=80 then folded every later command's
    # output at 80 columns whatever COLUMNS said (pytest-xdist: one process, many commands).
    from flows.commands import shared

    monkeypatch.setenv("COLUMNS", "80")
    out = shared._console()
    monkeypatch.setenv("COLUMNS", "300")
    assert out.width == 300
    out.print("x" * 250, highlight=False)
    assert capsys.readouterr().out == "x" * 250 + "\n"
    monkeypatch.delenv("COLUMNS")
    assert out.width == shared.PLAIN_WIDTH  # off a terminal: tables take the width they need


def test_gate_reports_from_the_run_folder_alone_its_spec_and_data_gone(tmp_path):
    """A run keeps what it asked (gates.run_inputs): a re-gate's flips show the prompts it kept
    and its what-if the profile it ran, with the spec deleted."""
    from gates.record import RunManifest
    from gates.run_inputs import RunInputs
    from load.profile import load_profile
    from tests.gates.records import record

    run = tmp_path / "run"
    record("baseline", None, [1.0] * 30 + [0.0] * 30).save(run / "baseline")
    record("w", "baseline", [0.0] + [1.0] * 29 + [0.0] * 30).save(run / "w")  # item 0 flips
    spec = tmp_path / "gone.yaml"
    RunManifest(candidate="c", stages=["baseline", "w"], spec_path=str(spec)).save(run)
    RunInputs(spec={}, load_profile=load_profile("ci"), load_profile_name="ci").keep(
        run, {"math": {"0": "the question the run asked"}})
    result = runner.invoke(app, ["gate", str(run), "--report", str(tmp_path / "report")],
                           env={"COLUMNS": "200"})
    assert result.exit_code in (0, 1), result.output
    md = (tmp_path / "report" / "report.md").read_text()
    assert "the question the run asked" in md
    assert "no load profile was passed" not in md  # the what-if's CPU check had the profile


def test_gate_prints_where_a_cuda_runs_engines_went(tmp_path):
    """`make gpu-check` ends with `gate`: the stage table, then the placement the run recorded."""
    from gates.record import RunManifest
    from infra.placement import EngineNeed, declared_gpus, plan_placement

    run = stored_run(tmp_path)
    placement = plan_placement(declared_gpus(80, 1), [
        EngineNeed("stage", name, 270_000_000, 46_080, 5120) for name in ("baseline", "w")
    ] + [EngineNeed("beside", "baseline", 270_000_000, 46_080, 5120)])
    manifest = RunManifest.read(run)
    manifest.placement = placement.model_dump(mode="json")
    manifest.save(run)
    result = runner.invoke(app, ["gate", str(run)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("placement: ")]
    assert any("CUDA_VISIBLE_DEVICES=0, gpu_memory_utilization 0.47" in line for line in lines), \
        result.output
    # A CPU run records no placement and prints none.
    assert "placement:" not in runner.invoke(app, ["gate", str(stored_run(tmp_path / "cpu"))],
                                             env={"COLUMNS": "200"}).output
