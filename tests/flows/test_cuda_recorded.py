"""What quantgate reads from CUDA vLLM, on logs and pages recorded on a real GPU: an NVIDIA H200
(143,771 MiB, driver 580.159.04) lent to session 23, CUDA vLLM 0.25.0 on torch 2.11.0+cu130,
served by quantgate's own engine class on the gpu-check placement (`python -m tools.cuda_record`;
tests/infra/vllm_logs/h200-0.25-*: start-up logs, /metrics, /v1/models, the recorder's summary
and each engine's greedy answers). Two engines were up at once, each at
gpu_memory_utilization 0.31 (45.2 GiB each by nvidia-smi), and the GPU held 0 MiB after both
stopped. The FP8 weight-only stage did not start: vLLM 0.25 picks the Humming kernel for
compressed-tensors W8A16 FP8 on Hopper, whose package the lent machine lacked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.plan import plan
from flows.served import Served, mismatches
from flows.spec import Spec
from gates.engine_facts import kernel_changes
from gates.record import StageRecord
from infra.placement import parse_nvidia_smi
from infra.vllm_engine import VllmEngine, engine_facts
from infra.vllm_facts import read_log
from tests.flows.checkpoints import make_checkpoint

LOGS = Path(__file__).parents[1] / "infra" / "vllm_logs"
GIB = 2**30


def recorded(name: str) -> tuple[dict, str, str]:
    """(the /v1/models entry, /metrics, start-up log) of one recorded H200 engine."""
    models = json.loads((LOGS / "h200-0.25-bf16.models.json").read_text())["data"][0]
    return (models, (LOGS / f"h200-0.25-{name}.metrics").read_text(),
            (LOGS / f"h200-0.25-{name}.log").read_text())


def facts(name: str):
    model, metrics, log = recorded(name)
    return engine_facts("http://127.0.0.1:8000", model, "0.25.0", metrics, log, [], {},
                        269_060_552)


def test_the_facts_of_a_real_cuda_vllm_engine_are_all_read():
    base, fp8 = facts("bf16"), facts("fp8-online")
    # "GPU KV cache size: 1,982,288 tokens" and the kv_cache_size_tokens label agree.
    assert base.kv_cache_tokens == 1_982_288 and base.kv_cache_tokens_from == "kv_cache_size_tokens"
    assert read_log(recorded("bf16")[2]).kv_cache_tokens == 1_982_288
    assert fp8.kv_cache_tokens == 1_987_040
    # "Model loading took 0.26 GiB" / "0.15 GiB": online FP8 halves the weights in memory while
    # the files on disk stay bf16 (weight_bytes).
    assert base.weight_memory_bytes == int(0.26 * GIB) and fp8.weight_memory_bytes == int(0.15 * GIB)
    assert base.kv_cache_bytes == int(42.54 * GIB) and fp8.kv_cache_bytes == int(42.64 * GIB)
    assert (base.quantization, fp8.quantization) == (None, "fp8")
    assert base.linear_kernels == []
    assert fp8.linear_kernels == ["CutlassFP8ScaledMMLinearKernel for "
                                  "Fp8PerTensorOnlineLinearMethod"]
    assert base.attention_backend == fp8.attention_backend == "FLASH_ATTN"
    assert not fp8.fp8_marlin_fallback  # an H200 has FP8 units
    assert fp8.kernels() == ("fp8: linear CutlassFP8ScaledMMLinearKernel; attention FLASH_ATTN")


def test_the_sign_off_names_the_kernel_change_of_online_fp8():
    axes = {"weights": "none", "activations": "none", "kv_cache": "auto"}
    fp8_axes = {"weights": "float8/tensor", "activations": "float8/token/dynamic",
                "kv_cache": "auto"}
    records = [StageRecord(name="baseline", kind="baseline", parent=None, axes=axes,
                           facts=facts("bf16")),
               StageRecord(name="fp8-activations", kind="activations", parent="baseline",
                           axes=fp8_axes, facts=facts("fp8-online"))]
    assert kernel_changes(records) == [{
        "stage": "fp8-activations",
        "change": "linear -; attention FLASH_ATTN → fp8: linear CutlassFP8ScaledMMLinearKernel; "
                  "attention FLASH_ATTN (vs baseline)"}]


@pytest.fixture
def gpu_check_stages(tmp_path, monkeypatch):
    """gpu-check's baseline and online-FP8 stages, their checkpoint where the recorded engines
    loaded it (models/smollm2-135m-bf16, relative to where they ran)."""
    monkeypatch.chdir(tmp_path)
    base = make_checkpoint(Path("models/smollm2-135m-bf16"))
    spec = Spec.model_validate({
        "candidate": "c", "baseline": {"checkpoint": str(base.resolve())},
        "engine": {"device": "cuda", "enforce_eager": True, "max_model_len": 4096},
        "stages": [{"name": "fp8-activations", "kind": "weights_activations",
                    "engine_flags": {"quantization": "fp8"}}],
        "evalsets": [{"name": "math", "limit": 40}]})
    return plan(spec)


def served(name: str) -> Served:
    model, metrics, log = recorded(name)
    engine = facts(name)
    return Served(model_root=model["root"], cache_dtype=engine.kv_cache_dtype,
                  config=VllmEngine.served_config(engine, log))


def test_the_served_check_passes_what_cuda_vllm_really_served(gpu_check_stages):
    baseline, fp8 = gpu_check_stages
    assert fp8.axes.weights == "float8/tensor" and fp8.axes.activations == "float8/token/dynamic"
    assert served("fp8-online").config["quantization"] == "fp8"
    assert mismatches(baseline, served("bf16"), {}, dtype="bfloat16") == []
    assert mismatches(fp8, served("fp8-online"), {}, dtype="bfloat16") == []
    # The check is live: the online-FP8 engine does not pass for the baseline.
    assert mismatches(baseline, served("fp8-online"), {}, dtype="bfloat16") == [
        "stage baseline serves weights float8/tensor (quantization fp8) but its axes say none",
        "stage baseline serves activations float8/tensor/dynamic (quantization fp8) but its "
        "axes say none"]


def test_an_engine_that_died_in_start_up_gives_no_facts_and_says_why():
    log = (LOGS / "h200-0.25-fp8-weights-no-humming.log").read_text()
    died = read_log(log)
    assert died.kv_cache_tokens is None and died.weight_memory_bytes is None
    assert died.attention_backend == "FLASH_ATTN"  # picked before the weights were processed
    assert "ModuleNotFoundError: No module named 'humming'" in log


def test_the_recorded_gpu_and_two_engines_side_by_side():
    summary = json.loads((LOGS / "h200-0.25-summary.json").read_text())
    gpu = parse_nvidia_smi("0, NVIDIA H200, 143771, 0")[0]
    assert summary["gpus"][0]["memory_bytes"] == gpu.memory_bytes == 143_771 * 2**20
    used = summary["stages"]["fp8-activations"]["memory_after_start"].splitlines()[1]
    assert used.startswith("90439 MiB")  # two engines at 0.31 each: 2 x 0.31 x 143,771 = 89,138
    assert summary["memory_after_stop"].splitlines()[1].startswith("0 MiB")
