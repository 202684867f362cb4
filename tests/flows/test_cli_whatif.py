"""`quantgate whatif`: predicted latency and capacity on target GPUs, from a spec or a run."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from gates.record import RunManifest
from tests.flows.test_spec import write_spec
from tests.gates.records import UNQUANTIZED, record

runner = CliRunner()
QWEN = json.loads((Path(__file__).parents[1] / "gates" / "qwen25_7b_config.json").read_text())
WIDE = {"COLUMNS": "250"}


def test_unknown_gpu_is_one_line_listing_the_known_ones(tmp_path):
    result = runner.invoke(app, ["whatif", str(tmp_path), "--gpu", "h100-sxm", "--gpu", "h1OO"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "unknown GPU 'h1OO'" in lines[0]
    for known in ("a100-80g", "h100-sxm", "h200", "b200", "l40s"):
        assert known in lines[0]


def test_neither_spec_nor_results_folder_is_refused(tmp_path):
    result = runner.invoke(app, ["whatif", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "neither a spec" in result.output


def test_from_a_spec_every_planned_stage_is_predicted(tmp_path):
    spec = qwen_spec(tmp_path)
    result = runner.invoke(app, ["whatif", str(spec), "--gpu", "h100-sxm", "--rate", "5"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "PREDICTION, not a measurement" in result.output
    # Not the ci profile's CPU-sized SLO: the reference GPU workload, saying so.
    assert "1024 prompt / 256 output tokens" in result.output
    assert "TTFT ≤ 1000 ms and TPOT ≤ 40 ms" in result.output
    assert "SLO preset reference" in result.output and "ci.yaml" in result.output
    assert "sized for this CPU, not a GPU fleet" in result.output
    for stage in ("baseline", "weights", "activations", "kv"):
        assert f"│ {stage} " in result.output
    assert "matmuls in fp8" not in result.output and "matmuls in int8" in result.output
    assert "KV fp8" in result.output and "goodput at 5 req/s" in result.output
    assert "Source: roofline, efficiencies" in result.output


def test_from_a_results_folder_emulated_stages_in_their_real_format(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("candidate: demo\nload_profile: ci\n")
    base = record("baseline", None, [1.0, 0.0])
    w8 = record("w8", "baseline", [1.0, 0.0], axes=UNQUANTIZED | {"weights": "int8/channel"})
    gone = record("gone", "baseline", [1.0, 0.0])
    base.shape = w8.shape = dict(QWEN)
    w8.emulated = True
    gone.facts.command = ["vllm", "--model", str(tmp_path / "deleted")]
    run = tmp_path / "run"
    for stage in (base, w8, gone):
        stage.save(run / stage.name)
    RunManifest(candidate="demo", stages=["baseline", "w8", "gone"], spec_path=str(spec)).save(run)
    result = runner.invoke(app, ["whatif", str(run), "--gpu", "b200"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "w8 (emulated: real format)" in result.output and "int8 weights" in result.output
    assert "no what-if for gone:" in result.output and "deleted" in result.output
    assert "PREDICTION" in result.output


def test_a_named_profile_stands_in_for_a_run_whose_spec_is_gone(tmp_path):
    base = record("baseline", None, [1.0, 0.0])
    base.shape = dict(QWEN)
    run = tmp_path / "run"
    base.save(run / "baseline")
    RunManifest(candidate="demo", stages=["baseline"], spec_path=str(tmp_path / "gone.yaml")).save(run)
    refused = runner.invoke(app, ["whatif", str(run), "--gpu", "l40s"], env=WIDE)
    assert refused.exit_code == 2 and "--profile" in refused.output
    result = runner.invoke(app, ["whatif", str(run), "--gpu", "l40s", "--profile", "ci"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "│ baseline │ l40s" in result.output and "profiles/ci.yaml" in result.output


def qwen_spec(tmp_path):
    spec = write_spec(tmp_path)
    for checkpoint in (tmp_path / "models").iterdir():
        config = checkpoint / "config.json"
        config.write_text(json.dumps(json.loads(config.read_text()) | QWEN))
    return spec


def test_gpus_are_judged_by_the_slo_preset_asked_for(tmp_path):
    spec = qwen_spec(tmp_path)
    result = runner.invoke(app, ["whatif", str(spec), "--gpu", "h100-sxm",
                                 "--slo", "mlperf-llama2-70b-interactive"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "TTFT ≤ 450 ms and TPOT ≤ 40 ms" in result.output
    assert "SLO preset mlperf-llama2-70b-interactive (MLPerf Inference" in result.output
    refused = runner.invoke(app, ["whatif", str(spec), "--slo", "mlperf-fast"])
    assert refused.exit_code == 2 and "unknown --slo 'mlperf-fast'" in refused.output


def test_a_profile_names_its_gpu_slo_and_keeps_its_request_sizes(tmp_path):
    spec = qwen_spec(tmp_path)
    profile = tmp_path / "fleet.yaml"
    profile.write_text("high_users: 8\nprompt_tokens: 512\noutput_tokens: 128\nrequests: 10\n"
                       "gpu_slo: mlperf-llama3.1-8b-server\n")
    result = runner.invoke(app, ["whatif", str(spec), "--gpu", "b200", "--profile",
                                 str(profile)], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "512 prompt / 128 output tokens" in result.output
    assert "TTFT ≤ 2000 ms and TPOT ≤ 100 ms" in result.output
    assert "gpu_slo of load profile" in result.output
    capacity = [line.split("│")[5].strip() for line in result.output.splitlines()
                if line.startswith("│ baseline")]
    assert capacity and "e+" not in capacity[0], result.output  # 14,720 req/s, not 1.472e+04


def test_an_unknown_gpu_slo_in_a_profile_is_refused_by_name():
    import pytest
    from pydantic import ValidationError

    from load.profile import LoadProfile

    with pytest.raises(ValidationError, match="unknown GPU SLO preset 'h100'"):
        LoadProfile.model_validate({"high_users": 4, "prompt_tokens": 64, "output_tokens": 16,
                                    "requests": 10,
                                    "gpu_slo": "h100"})


def test_a_mixed_checkpoint_in_a_spec_is_predicted_on_each_formats_share(tmp_path):
    """A repair-shaped checkpoint (INT4 with every down_proj kept in INT8) is predicted from its
    mix, between plain INT4 and plain INT8, not refused for naming two formats."""
    from tests.flows.checkpoints import compressed_tensors, int_args, make_checkpoint

    mixed = compressed_tensors(int_args(4, "group", 128))
    mixed["config_groups"]["group_1"] = {"targets": [r"re:.*\.down_proj$"],
                                         "weights": int_args(8, "channel"),
                                         "input_activations": None, "output_activations": None}
    folders = {name: make_checkpoint(tmp_path / name, qc) for name, qc in (
        ("bf16", None), ("int4", compressed_tensors(int_args(4, "group", 128))), ("mixed", mixed),
        ("int8", compressed_tensors(int_args(8, "channel"))))}
    for folder in folders.values():
        config = folder / "config.json"
        config.write_text(json.dumps(json.loads(config.read_text()) | QWEN))
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "candidate": "mixed", "baseline": {"checkpoint": str(folders["bf16"])},
        "stages": [{"name": name, "kind": "weights", "parent": "baseline",
                    "checkpoint": str(folders[name])} for name in ("int4", "mixed", "int8")],
        "evalsets": [{"name": "math", "limit": 60}]}))
    result = runner.invoke(app, ["whatif", str(spec), "--gpu", "h100-sxm"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "mixed weights: int4/group128 on" in result.output and "int8/channel on" in result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines()
            if line.count("│") > 4}
    # Decode streams the weights: the one-user TPOT lies between the two plain formats'.
    tpot = {name: float(rows[name].split("│")[4]) for name in ("int4", "mixed", "int8")}
    assert tpot["int4"] < tpot["mixed"] < tpot["int8"], tpot


def test_a_rate_the_simulation_cannot_run_is_one_line_from_the_worker_processes(tmp_path):
    """The rate is refused inside each (stage, GPU) prediction, which runs in a worker process:
    the refusal comes back as the one line and exit 2 a refusal in the command itself gives."""
    result = runner.invoke(app, ["whatif", str(qwen_spec(tmp_path)), "--rate", "1e12"], env=WIDE)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --rate 1e+12 req/s: the simulation "
                                                   "would draw"), result.output
