"""A real `quantgate run` of flows/specs/gpu-check.yaml on a lent NVIDIA H100 80GB HBM3 (session
38: CUDA vLLM 0.25.0 on torch 2.11.0+cu130, carried by tools/cuda_carry; Prefect, MLflow, lm-eval
and Locust as in any run), kept as recorded/h100-gpu-check.tar.gz: the stage records, quality,
load and paired timings of the baseline and the control, the online-FP8 stage's answers (the run
was stopped during its timing, at the device time's end), and the three engines' start-up logs
(access lines left out).

What it showed, and these tests hold: the control served the baseline again and passed every
rule; online FP8 (`--quantization fp8`: CUTLASS FP8 matmuls, per-tensor weights, per-token
activations) kept math accuracy within the 8-point margin but made the demo model's math answers
ramble (x1.17 tokens, 110 of 318 cut at the budget where the baseline had 58): a rollback on
length, which the flow saw at the second look and stopped growing for. The run recorded the
spec's declared "GPU 80 GiB" as its placement's GPU; quantgate now plans for nvidia-smi's cards
(flows.engines.run_gpus), so `recorded_run` writes in the name nvidia-smi gave."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from gates.decide import decide, load_records
from gates.length import length_checks
from gates.policy import GatePolicy
from gates.record import QualityResult, StageRecord
from infra.vllm_facts import read_log

RECORDED = Path(__file__).parent / "recorded" / "h100-gpu-check.tar.gz"
H100 = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 81559 * 2**20, "used_bytes": 0}
FP8_AXES = {"weights": "float8/tensor", "activations": "float8/token/dynamic", "kv_cache": "auto"}


@pytest.fixture
def run(tmp_path) -> Path:
    """The recorded run folder, gated as the finished stages it holds (baseline, control)."""
    with tarfile.open(RECORDED) as archive:
        archive.extractall(tmp_path, filter="data")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["stages"] == ["baseline", "control", "fp8"]  # as the run left it
    manifest["stages"] = ["baseline", "control"]
    manifest["placement"]["gpus"] = [H100]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path


def test_the_control_stage_on_a_real_h100_passes_every_rule(run):
    candidate, records = load_records(run)
    control = next(s for s in decide(candidate, records, GatePolicy()).stages
                   if s.stage == "control")
    assert control.passed and control.failures == []
    # Served the same: no divergence from the baseline's tokens.
    assert records[1].quality.divergence.mean_kl == pytest.approx(0.0, abs=1e-6)


def test_online_fp8_on_an_h100_rolls_back_on_length_not_on_accuracy(run):
    _, records = load_records(run)
    baseline = records[0]
    assert len(baseline.quality.tasks["math"].items) == 318  # its extra items merged
    fp8 = StageRecord(name="fp8", kind="weights_activations", parent="baseline", axes=FP8_AXES,
                      quality=QualityResult.model_validate_json(
                          (run / "fp8" / "quality" / "quality.json").read_text()))
    checks = {c.rule: c for c in length_checks(fp8, baseline, GatePolicy(), baseline)}
    assert checks["length.math"].status == "fail" and checks["length"].status == "fail"
    assert (checks["length.math"].details["cut"],
            checks["length.math"].details["reference_cut"]) == (110, 58)
    assert checks["length.finish"].status == "fail"
    assert checks["length.business"].status == "inconclusive"
    verdict = decide("c", [baseline, fp8], GatePolicy()).stages[1]
    failed = {c.rule for c in verdict.failures}
    assert "length.math" in failed and not any(rule.startswith("quality") for rule in failed)


def test_the_h100_logs_give_the_engine_facts_and_the_fp8_kernel():
    with tarfile.open(RECORDED) as archive:
        log = {name: archive.extractfile(f"./{name}/engine.log").read().decode()
               for name in ("baseline", "fp8")}
    base, fp8 = read_log(log["baseline"]), read_log(log["fp8"])
    # "GPU KV cache size: 1,106,480 tokens" at gpu_memory_utilization 0.31 of 79.6 GiB.
    assert (base.kv_cache_tokens, fp8.kv_cache_tokens) == (1_106_480, 1_111_232)
    assert base.weight_memory_bytes == int(0.26 * 2**30)  # "Model loading took 0.26 GiB"
    assert fp8.weight_memory_bytes == int(0.15 * 2**30)
    assert fp8.linear_kernels == ["CutlassFP8ScaledMMLinearKernel for "
                                  "Fp8PerTensorOnlineLinearMethod"]
    assert not fp8.fp8_marlin_fallback  # an H100 has FP8 units
    assert base.attention_backend == fp8.attention_backend == "FLASH_ATTN"


def test_the_report_of_the_h100_run_names_the_gpu_its_placement_and_checks_the_whatif_on_it(run):
    result = CliRunner().invoke(app, ["gate", str(run), "--report", str(run / "report")])
    assert "placement: 1 GPU(s), NVIDIA H100 80GB HBM3 80 GiB" in result.output
    md = (run / "report" / "report.md").read_text()
    assert "### Checked against this run's own measurement (GPU: NVIDIA H100 80GB HBM3)" in md
    # A 135M model is host-bound on an H100: the fitted knobs say how far from the roofline.
    assert "NVIDIA H100 SXM5 80GB" in md and "| baseline | 32.5 / 32.5 | 0% |" in md
    assert "linear -; attention FLASH_ATTN" in md and "gpu_memory_utilization 0.31" in md
