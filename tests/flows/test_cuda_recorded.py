"""What quantgate reads from CUDA vLLM, on logs and pages recorded on a real GPU: an NVIDIA H200
(143,771 MiB, driver 580.159.04) lent to session 23, CUDA vLLM 0.25.0 on torch 2.11.0+cu130,
served by quantgate's own engine class on the gpu-check placement (`python -m tools.cuda_record`;
tests/infra/vllm_logs/h200-0.25-*: start-up logs, /metrics, /v1/models, the recorder's summary
and each engine's greedy answers). Two engines were up at once, each at
gpu_memory_utilization 0.31 (45.2 GiB each by nvidia-smi), and the GPU held 0 MiB after both
stopped. The FP8 weight-only stage did not start: vLLM 0.25 picks the Humming kernel for
compressed-tensors W8A16 FP8 on Hopper, whose package the lent machine lacked.

Session 25, on a lent H200 again with the same vLLM (carried by `python -m tools.cuda_carry`,
humming-kernels 0.1.10 this time): the FP8 weight-only engine (h200-0.25-fp8-weights) and online
FP8 with an FP8 KV cache (h200-0.25-fp8-kv), three engines up at once at 0.31
(h200-0.25-summary-s25.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.plan import plan
from flows.served import Served, mismatches
from flows.spec import Spec
from gates.engine_facts import kernel_changes
from gates.record import StageRecord
from infra.fp8_checkpoint import QUANTIZATION_CONFIG
from infra.placement import parse_nvidia_smi
from infra.vllm_engine import VllmEngine, engine_facts
from infra.vllm_facts import read_log
from tests.flows.checkpoints import make_checkpoint

LOGS = Path(__file__).parents[1] / "infra" / "vllm_logs"
GIB = 2**30


def recorded(name: str) -> tuple[dict, str, str]:
    """(the /v1/models entry, /metrics, start-up log) of one recorded H200 engine."""
    own = LOGS / f"h200-0.25-{name}.models.json"
    models_json = own if own.exists() else LOGS / "h200-0.25-bf16.models.json"
    models = json.loads(models_json.read_text())["data"][0]
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


def test_fp8_weight_only_on_hopper_runs_a_kernel_its_log_does_not_name():
    weights, base = facts("fp8-weights"), facts("bf16")
    # "GPU KV cache size: 1,983,376 tokens"; "Model loading took 0.19 GiB" against bf16's 0.26
    # (embeddings and lm_head stay bf16).
    assert weights.kv_cache_tokens == 1_983_376 and weights.kv_cache_tokens_from == "kv_cache_size_tokens"
    assert weights.weight_memory_bytes == int(0.19 * GIB)
    assert weights.quantization == "compressed-tensors" and weights.kv_cache_dtype == "auto"
    # vLLM 0.25 calls init_wfp8_a16_linear_kernel without a module name, so no "Selected ..."
    # line; its _POSSIBLE_WFP8A16_KERNELS on CUDA are [HummingFP8ScaledMMLinearKernel,
    # MarlinFP8ScaledMMLinearKernel] (model_executor/kernels/linear/__init__.py). The facts say
    # that the kernel was not logged rather than show a bare "-".
    assert weights.linear_kernels == [] and not weights.fp8_marlin_fallback
    assert weights.kernels() == "compressed-tensors: linear not logged; attention FLASH_ATTN"
    # Humming compiled its kernels in the profile run: 50 s between the weights and the KV cache.
    log = recorded("fp8-weights")[2]
    assert "16:50:21 [model_runner.py:302] Model loading took 0.19 GiB" in log
    assert "16:51:11 [gpu_worker.py:538] Available KV cache memory: 42.56 GiB" in log
    assert base.kernels() != weights.kernels()


def test_the_served_check_passes_the_fp8_weight_only_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = make_checkpoint(Path("models/smollm2-135m-bf16"))
    fp8 = make_checkpoint(Path("models/smollm2-135m-fp8-weights"), QUANTIZATION_CONFIG)
    spec = Spec.model_validate({
        "candidate": "c", "baseline": {"checkpoint": str(base.resolve())},
        "engine": {"device": "cuda", "enforce_eager": True, "max_model_len": 4096},
        "stages": [{"name": "fp8-weights", "kind": "weights", "checkpoint": str(fp8.resolve())}],
        "evalsets": [{"name": "math", "limit": 40}]})
    baseline, stage = plan(spec)
    assert (stage.axes.weights, stage.axes.activations) == ("float8/tensor", "none")
    config = {"quantization_config": QUANTIZATION_CONFIG}
    assert mismatches(stage, served("fp8-weights"), config, dtype="bfloat16") == []
    assert mismatches(baseline, served("fp8-weights"), config, dtype="bfloat16") != []


def test_an_fp8_kv_cache_doubles_the_tokens_and_its_default_scales_are_read():
    online, kv = facts("fp8-online"), facts("fp8-kv")
    # Same weights and kernels, the cache in one byte a value: 1,987,040 -> 3,974,096 tokens in
    # the same 42.64 GiB ("GPU KV cache size" and the kv_cache_size_tokens label agree), twice
    # as many to within the block rounding.
    assert (online.kv_cache_tokens, kv.kv_cache_tokens) == (1_987_040, 3_974_096)
    assert read_log(recorded("fp8-kv")[2]).kv_cache_tokens == 3_974_096
    assert kv.kv_cache_bytes == online.kv_cache_bytes == int(42.64 * GIB)
    assert (online.kv_cache_dtype, kv.kv_cache_dtype) == ("auto", "fp8")
    assert kv.kernels() == online.kernels()  # FLASH_ATTN (FA3) holds the fp8 cache itself
    # "Using KV cache scaling factor 1.0 for fp8_e4m3": no scales in the checkpoint.
    assert kv.kv_default_scales and not online.kv_default_scales
    assert not facts("bf16").kv_default_scales


def kv_stage(tmp_path, calibrated: bool):
    """An FP8 KV stage after FP8 weights; `calibrated`: its checkpoint declares kv_cache_scheme
    scales (the axis '/calibrated'), else it serves the weights stage's checkpoint."""
    base = make_checkpoint(tmp_path / "models" / "smollm2-135m-bf16")
    weights = make_checkpoint(tmp_path / "models" / "fp8", QUANTIZATION_CONFIG)
    scheme = QUANTIZATION_CONFIG | {"kv_cache_scheme": {"num_bits": 8, "type": "float",
                                                        "strategy": "tensor", "dynamic": False}}
    kv = make_checkpoint(tmp_path / "models" / "fp8-kv", scheme) if calibrated else weights
    spec = Spec.model_validate({
        "candidate": "c", "baseline": {"checkpoint": str(base)},
        "engine": {"device": "cuda", "enforce_eager": True, "max_model_len": 4096},
        "stages": [{"name": "w", "kind": "weights", "checkpoint": str(weights)},
                   {"name": "kv", "kind": "kv_cache", "checkpoint": str(kv),
                    "engine_flags": {"kv_cache_dtype": "fp8"}}],
        "evalsets": [{"name": "math", "limit": 40}]})
    return plan(spec)[-1]


def test_a_stage_whose_checkpoint_calibrates_the_kv_scales_is_refused_on_default_scales(
        tmp_path):
    recorded_kv = served("fp8-kv")
    assert recorded_kv.config["kv_scales"] == "1.0" and recorded_kv.cache_dtype == "fp8"
    stage = kv_stage(tmp_path, calibrated=True)
    assert stage.axes.kv_cache == "fp8_e4m3/calibrated"
    problems = [p for p in mismatches(stage, recorded_kv, {}, dtype="bfloat16") if "scales" in p]
    assert problems == [
        "stage kv serves its KV cache on vLLM's default scales 1.0 (its start-up log) but its "
        "axes say fp8_e4m3/calibrated: the checkpoint's kv_cache_scheme scales were not loaded"]
    uncalibrated = kv_stage(tmp_path / "plain", calibrated=False)
    assert uncalibrated.axes.kv_cache == "fp8_e4m3"
    assert not [p for p in mismatches(uncalibrated, recorded_kv, {}, dtype="bfloat16")
                if "scales" in p]


def test_three_engines_at_0_31_fit_an_h200_and_free_it_on_stop():
    summary = json.loads((LOGS / "h200-0.25-summary-s25.json").read_text())
    first = summary["run1"]
    used = first["stages"]["fp8-activations"]["memory_after_start"].splitlines()[1]
    assert used.startswith("135700 MiB")  # 3 x 0.31 x 143,771 = 133,707 MiB, plus 0.65 GiB each
    assert first["memory_after_stop"].splitlines()[1].startswith("0 MiB")
    assert [line.split(", ")[1] for line in first["processes"].splitlines()[1:]] == [
        "45202 MiB", "45254 MiB", "45224 MiB"]


def test_online_fp8_greedy_answers_do_not_repeat_where_bf16_ones_do():
    """Greedy answers of the same engine configuration, served twice (60 items, 16 in flight):
    bf16 repeated 56 of them across sessions 23 and 25; online FP8 repeated only 9 within
    session 25. Its activation scales are per token on CUTLASS (vLLM 0.25's
    Fp8PerTensorOnlineLinearMethod: kFp8DynamicTokenSym), not batch-wide; the GEMM configuration
    CUTLASS picks by batch size is the likely cause (not established)."""
    def answers(name: str) -> dict[str, str]:
        rows = json.loads((LOGS / f"h200-0.25-{name}.answers.json").read_text())
        return {row["id"]: row["text"] for row in rows}

    def same(a: str, b: str) -> int:
        x, y = answers(a), answers(b)
        return sum(x[i] == y[i] for i in x)

    assert same("bf16", "bf16-again") == 56
    assert same("fp8-online", "fp8-online-again") < 31
