"""The report's capacity what-if from stored records: shapes, target GPUs, the CPU check."""

from __future__ import annotations

import json

import pytest

from gates.record import RunManifest
from gates.whatif import SimSettings, Workload
from gates.whatif.calibrate import describe_device
from gates.whatif.cpu import cpu_device
from gates.whatif.hardware import device_named
from gates.whatif.records import run_workload, stage_shape
from gates.whatif.section import NOT_COMPARABLE, whatif_section
from infra.placement import Gpu, parse_nvidia_smi
from load.profile import Slo
from tests.gates.records import UNQUANTIZED, record

# SmolLM2-135M's config.json, model-shape keys (the demo model).
SMOLLM2 = {
    "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152,
    "tie_word_embeddings": True,
}
QUICK = SimSettings(warmup_s=2.0, measured_requests=100, iterations=3)
WORKLOAD = Workload(prompt_tokens=128, output_tokens=32, slo=Slo(ttft_ms=2000, tpot_ms=200))
# A fixed CPU (AVX-512 class, 2 cores), so that the test does not depend on the machine.
CPU = describe_device("cpu", tflops={"bf16": 0.66, "int8": 1.33}, bandwidth_gbs=20,
                      memory_gib=23, name="test CPU")
W8 = UNQUANTIZED | {"weights": "int8/channel"}
W8A8 = W8 | {"activations": "int8/token/dynamic"}


def records(tmp_path):
    """baseline (shape kept) -> w8 emulated (shape kept) -> a8 (old record: config.json via
    --model, capacity searched) -> gone (old record, checkpoint deleted)."""
    checkpoint = tmp_path / "a8-checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(SMOLLM2 | {"model_type": "llama"}))
    base = record("baseline", None, [1.0, 0.0] * 10, ttft=60.0, tpot=20.0)
    w8 = record("w8", "baseline", [1.0, 0.0] * 10, ttft=66.0, tpot=19.0, axes=W8)
    a8 = record("a8", "w8", [1.0, 0.0] * 10, ttft=59.0, tpot=20.0, axes=W8A8, kind="activations")
    gone = record("gone", "baseline", [1.0, 0.0] * 10, axes=W8)
    base.shape = w8.shape = dict(SMOLLM2)
    w8.emulated = True
    a8.facts.command = ["python", "-m", "vllm", "--model", str(checkpoint)]
    a8.load.capacity_rps, a8.load.capacity_note = 9.0, "between 9 (passes) and 10 (fails) req/s"
    gone.facts.command = ["python", "-m", "vllm", "--model", str(tmp_path / "deleted")]
    for stage in (base, w8, a8, gone):
        stage.facts.kv_cache_bytes = 2**30
    return [base, w8, a8, gone]


def test_shape_from_the_record_then_config_json_then_none(tmp_path):
    base, _, a8, gone = records(tmp_path)
    assert stage_shape(base).config == SMOLLM2
    assert stage_shape(a8).config["hidden_size"] == 576
    assert "predates" in stage_shape(a8).source
    missing = stage_shape(gone)
    assert missing.config is None and "no what-if for this stage" in missing.source


@pytest.fixture(scope="module")
def section(tmp_path_factory):
    return whatif_section(records(tmp_path_factory.mktemp("whatif")), WORKLOAD, "profile ci",
                          settings=QUICK, cpu_settings=QUICK, cpu_described=CPU)


def test_every_stage_with_a_shape_is_predicted_on_both_target_gpus(section):
    assert [(r["stage"], r["gpu"]) for r in section.rows] == [
        (stage, gpu) for stage in ("baseline", "w8", "a8") for gpu in ("h100-sxm", "b200")]
    assert len(section.skipped) == 1
    assert section.skipped[0].startswith("gone: ") and "deleted" in section.skipped[0]
    rows = {(r["stage"], r["gpu"]): r for r in section.rows}
    # The emulated stage is predicted in its real format (int8 weights), not its bf16 twin.
    assert rows["w8", "h100-sxm"]["emulated"] and "int8 weights" in rows["w8", "h100-sxm"]["format"]
    assert "matmuls in int8" in rows["a8", "b200"]["format"]
    # W8A8's int8 matmuls buy capacity on an H100; B200 beats H100.
    capacity = {key: float(row["capacity"].replace(",", "")) for key, row in rows.items()}
    assert capacity["a8", "h100-sxm"] > 1.1 * capacity["baseline", "h100-sxm"]
    assert capacity["baseline", "b200"] > capacity["baseline", "h100-sxm"]
    assert "roofline, efficiencies compute 0.44" in section.sources[0]
    # GPUs are judged at the reference GPU workload, not the CPU-sized profile of the run.
    assert "1024 prompt / 256 output tokens" in section.workload
    assert "reference GPU serving workload" in section.workload_source


def test_cpu_check_fits_the_baseline_and_compares_really_served_stages(section):
    rows = {r["stage"]: r for r in section.cpu_rows}
    assert set(rows) == {"baseline", "w8", "a8"}
    assert rows["baseline"]["ttft_error"] == "0%" and rows["baseline"]["tpot_error"] == "0%"
    assert "calibration point" in rows["baseline"]["note"]
    assert rows["w8"]["note"] == NOT_COMPARABLE and rows["w8"]["tpot_error"] == "—"
    a8 = rows["a8"]["values"]
    # int8 matmuls and half the weight bytes: the roofline predicts a faster a8 than measured.
    assert a8["ttft"] < a8["ttft_measured"] and a8["tpot"] < a8["tpot_measured"]
    assert rows["a8"]["ttft_error"].startswith("-")
    assert a8["capacity_measured"] == 9.0 and rows["a8"]["capacity_error"] != "—"
    assert rows["baseline"]["capacity_measured"] == "not searched"
    assert "fitted to baseline's low-load TTFT 60.0 ms and TPOT 20.00 ms" in section.cpu_knobs


def test_without_the_profile_the_reference_workload_is_used_and_said(tmp_path):
    found = whatif_section(records(tmp_path)[:1], settings=QUICK, gpus=["h100-sxm"])
    assert "1024 prompt / 256 output tokens" in found.workload
    assert "reference GPU serving workload" in found.workload_source
    assert found.cpu_rows == [] and "no load profile was passed" in found.cpu_note


def test_a_calibration_that_cannot_fit_says_so(tmp_path):
    slow = describe_device("cpu", tflops={"bf16": 0.001}, bandwidth_gbs=20, memory_gib=23)
    found = whatif_section(records(tmp_path)[:1], WORKLOAD, gpus=(), cpu_settings=QUICK,
                           cpu_described=slow)
    assert found.cpu_rows == [] and "calibration failed" in found.cpu_note
    assert "faster than" in found.cpu_note


def test_a_cuda_run_is_checked_on_the_gpu_it_served_on_not_on_this_cpu(tmp_path):
    """A lent H100's run was once checked against the CPU of the machine re-gating it ("measured
    32.5 ms is faster than cpu's peak allows"): the placement's GPU is what measured it."""
    h100 = parse_nvidia_smi("0, NVIDIA H100 80GB HBM3, 81559, 0")[0]
    baseline = records(tmp_path)[:1]
    found = whatif_section(baseline, WORKLOAD, gpus=(), cpu_settings=QUICK,
                           measured_on=h100)
    assert found.measured_on == "GPU: NVIDIA H100 80GB HBM3"
    assert found.cpu_device == "NVIDIA H100 SXM5 80GB" and "79.6 GiB" in found.cpu_where
    assert found.cpu_rows[0]["ttft_error"] == "0%"  # the baseline, fitted on the H100's figures
    unknown = Gpu(index=0, name="NVIDIA RTX 6000 Ada Generation", memory_bytes=48 * 2**30)
    found = whatif_section(baseline, WORKLOAD, gpus=(), measured_on=unknown)
    assert found.cpu_rows == [] and "gates/whatif/gpus.yaml does not describe" in found.cpu_note


@pytest.mark.parametrize(("smi_name", "memory_gib", "key"), [
    ("NVIDIA H100 80GB HBM3", 79.6, "h100-sxm"), ("NVIDIA H200", 140.4, "h200"),
    ("NVIDIA A100-SXM4-80GB", 79.2, "a100-80g"), ("NVIDIA L40S", 44.5, "l40s"),
    ("NVIDIA H100 PCIe", 79.6, None), ("NVIDIA H100 NVL", 93.0, None),
    ("NVIDIA A100-SXM4-40GB", 39.4, None), ("GPU", 80.0, None)])
def test_nvidia_smi_names_map_to_the_cards_the_data_file_describes(smi_name, memory_gib, key):
    found = device_named(smi_name, memory_gib)
    assert (found.key if found else None) == key


def test_cpu_described_from_cpuinfo():
    avx512 = ("model name\t: AMD EPYC\ncpu MHz\t\t: 2500.0\n"
              "flags\t\t: fma avx2 avx512f avx512_bf16 avx512_vnni\n")
    avx2 = "model name\t: Some Xeon\ncpu MHz\t\t: 2500.0\nflags\t\t: fma avx2\n"
    fast, plain = (cpu_device(text, cores=2, memory_gib=23) for text in (avx512, avx2))
    assert fast.tflops["bf16"] == pytest.approx(2 * 2.5e9 * 128 / 1e12)
    assert fast.tflops["int8"] == pytest.approx(2 * fast.tflops["bf16"])
    assert plain.tflops["bf16"] == plain.tflops["int8"] == pytest.approx(2 * 2.5e9 * 32 / 1e12)
    assert fast.bandwidth_gbs == 20 and "stated, not measured" in fast.source
    assert "avx512_bf16" in fast.name and not fast.supports("fp8")


def test_run_workload_reads_the_spec_the_manifest_names(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("candidate: x\nload_profile: ci\n")
    RunManifest(candidate="x", stages=["baseline"], spec_path=str(spec)).save(tmp_path / "run")
    workload, origin = run_workload(tmp_path / "run")
    assert (workload.prompt_tokens, workload.output_tokens) == (128, 16)
    assert workload.slo.tpot_ms == 200 and "ci.yaml" in origin
