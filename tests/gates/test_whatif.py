"""The what-if's parts: GPU data, model shape, stage formats, the scheduler, calibration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gates.whatif import Workload, whatif_table, workload_from_profile
from gates.whatif.calibrate import Baseline, calibrate, describe_device
from gates.whatif.hardware import device, load_devices
from gates.whatif.scheduler import SchedulerConfig, kv_pool_blocks, simulate
from gates.whatif.search import SimSettings, at_rate, capacity, low_load, rate_ceiling
from gates.whatif.shape import ModelShape, stage_format
from gates.whatif.steptime import Roofline
from infra.errors import SpecError
from load.profile import LoadProfile

QWEN = ModelShape.from_config(json.loads(Path(__file__).with_name("qwen25_7b_config.json").read_text()))
# SmolLM2-135M's shape (the demo model): tied embeddings, 9 heads of 64, 3 KV heads.
SMOLLM2 = ModelShape.from_config({
    "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
    "tie_word_embeddings": True,
})
BF16 = {"weights": "none", "activations": "none", "kv_cache": "auto"}
W4A16 = {"weights": "int4/group128", "activations": "none", "kv_cache": "auto"}
W8A8_INT8 = {"weights": "int8/channel", "activations": "int8/token/dynamic", "kv_cache": "auto"}
W8A8_FP8 = {"weights": "float8/channel", "activations": "float8/token/dynamic", "kv_cache": "auto"}


def test_gpu_file_has_the_five_targets_with_dense_figures():
    devices = load_devices()
    assert {"a100-80g", "h100-sxm", "h200", "b200", "l40s"} <= set(devices)
    h100 = devices["h100-sxm"]
    assert h100.tflops["bf16"] == 989 and h100.tflops["fp8"] == 1979  # dense, not 2:4 sparse
    assert h100.bandwidth_gbs == 3350 and h100.memory_gib == 80
    assert "fp8" not in devices["a100-80g"].tflops and devices["b200"].tflops["fp4"] == 9000
    assert all(d.source and 0 < d.efficiency.compute <= 1 for d in devices.values())


def test_unknown_gpu_names_the_closest():
    with pytest.raises(SpecError, match="did you mean 'h100-sxm'"):
        device("h100-sx")


def test_qwen_shape_from_config():
    assert QWEN.head_dim == 128 and QWEN.num_kv_heads == 4 and not QWEN.tied_embeddings
    assert QWEN.parameter_count == pytest.approx(7.62e9, rel=0.005)  # published: 7.61 B
    assert SMOLLM2.parameter_count == pytest.approx(134.5e6, rel=0.01)
    # 28 layers x 4 KV heads x 128 x (K and V) x 2 bytes
    assert stage_format(BF16, QWEN).kv_bytes_per_token(QWEN) == 57_344
    fp8_kv = {**BF16, "kv_cache": "fp8_e4m3"}
    assert stage_format(fp8_kv, QWEN).kv_bytes_per_token(QWEN) == 28_672
    # A KV repair keeps 7 of the 28 layers' cache in bf16 (--kv-cache-dtype-skip-layers).
    repaired = stage_format({**BF16, "kv_cache": "fp8_e4m3/skip:0,1,2,3,4,5,6"}, QWEN)
    assert repaired.kv_bytes_per_token(QWEN) == 28_672 + 7 * 1_024
    assert "fp8 on 75% of the layers" in repaired.note


def test_flops_per_token():
    prefill = QWEN.prefill_flops(1024)
    assert prefill / 1024 == pytest.approx(2 * QWEN.body_params, rel=0.03)  # attention adds ~1.6 %
    assert QWEN.decode_flops(2048) > QWEN.decode_flops(0)


@pytest.mark.parametrize(
    ("axes", "bytes_per_param", "compute"),
    [
        (BF16, 2.0, "bf16"),
        (W4A16, 0.5 + 2 / 128, "bf16"),
        ({**W4A16, "weights": "int4/group32"}, 0.5 + 2 / 32, "bf16"),
        (W8A8_FP8, 1 + 4 / 3584, "fp8"),
        ({**W8A8_FP8, "weights": "float8/block128x128"}, 1 + 4 / 128**2, "fp8"),
        (W8A8_INT8, 1 + 2 / 3584, "int8"),
        ({"weights": "float4/tensor_group", "activations": "none", "kv_cache": "auto"}, 0.5 + 1 / 16,
         "bf16"),
        ({"weights": "float4/group32", "activations": "none", "kv_cache": "auto"}, 0.5 + 1 / 32,
         "bf16"),
    ],
)
def test_stage_format_from_axes(axes, bytes_per_param, compute):
    fmt = stage_format(axes, QWEN)
    assert fmt.weight_bytes_per_param == pytest.approx(bytes_per_param)
    assert fmt.compute_dtype == compute


@pytest.mark.parametrize(
    "axes",
    [
        {**BF16, "weights": "gguf/q4"},
        {**BF16, "kv_cache": "int4"},
        {**BF16, "weights": "int4/group128+int8/channel"},
    ],
)
def test_stage_format_refuses_what_it_cannot_read(axes):
    with pytest.raises(SpecError):
        stage_format(axes, QWEN)


def test_a_mixed_checkpoint_streams_each_format_on_its_share():
    """A repair's checkpoint (INT4 with its MLPs kept in INT8, say) is predicted from its mix;
    its resident bytes agree with the bytes the repair search counted per module."""
    from gates.repair import RepairOption, weight_bytes
    from tests.gates.test_repair import PARAMS

    share = 2 * 576 * 1536 / (576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536)
    axes = {**W4A16, "weights": "int4/group16+int8/channel",
            "weight_mix": {"int4/group16": 1 - share, "int8/channel": share}}
    fmt = stage_format(axes, SMOLLM2)
    alone = {w: stage_format({**W4A16, "weights": w}, SMOLLM2).weight_bytes_per_param
             for w in ("int4/group16", "int8/channel")}
    assert fmt.weight_bytes_per_param == pytest.approx(
        (1 - share) * alone["int4/group16"] + share * alone["int8/channel"])
    assert "int4/group16 on 50%, int8/channel on 50%" in fmt.note
    counted = weight_bytes(PARAMS, RepairOption(weights="int4/group16", bytes=0,
                                                kept_kinds=["up_proj", "down_proj"],
                                                kept_as="int8/channel"))
    assert fmt.resident_weight_bytes(SMOLLM2) == pytest.approx(counted, rel=0.01)


def test_fp8_on_a100_runs_as_weight_only():
    roofline = Roofline(QWEN, stage_format(W8A8_FP8, QWEN), device("a100-80g"))
    assert roofline.matmul_dtype == "bf16"
    table = whatif_table({"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                          "num_key_value_heads": 3, "intermediate_size": 1536,
                          "vocab_size": 49152, "tie_word_embeddings": True},
                         {"fp8": W8A8_FP8}, ["a100-80g"], Workload(prompt_tokens=64, output_tokens=8),
                         settings=SimSettings(measured_requests=100, iterations=3), rate=5.0)
    assert "a100-80g has no fp8: matmuls in bf16" in table.loc[0, "format"]
    assert table.loc[0, "rate_rps"] == 5.0 and table.loc[0, "rate_goodput"] == 1.0
    assert table.loc[0, "rate_tpot_p99_ms"] < table.loc[0, "tpot_p99_ms"]


def test_kv_pool_is_memory_left_after_weights():
    h100, config = device("h100-sxm"), SchedulerConfig()
    bf16 = Roofline(QWEN, stage_format(BF16, QWEN), h100)
    fp8_kv = Roofline(QWEN, stage_format({**BF16, "kv_cache": "fp8"}, QWEN), h100)
    tokens = kv_pool_blocks(bf16, config) * config.block_size
    left = 80 * 0.9 - 15.2e9 / 2**30 - h100.efficiency.reserved_memory_gib
    assert tokens == pytest.approx(left * 2**30 / 57_344, rel=0.01)
    assert kv_pool_blocks(fp8_kv, config) == pytest.approx(2 * kv_pool_blocks(bf16, config), abs=1)


def test_a_full_pool_preempts_and_everything_still_finishes():
    roofline = Roofline(QWEN, stage_format(BF16, QWEN), device("h100-sxm"))
    small = SchedulerConfig(kv_cache_gib=0.5)  # ~9,000 tokens: 7 requests of 1,280
    arrivals = np.linspace(0, 0.5, 40)
    result = simulate(roofline, small, arrivals, 1024, 256, measured=np.ones(40, dtype=bool))
    assert result.preemptions > 0
    assert np.all(np.isfinite(result.tpot_ms))
    assert result.max_running <= 9_000 // 1_024 + 1
    roomy = simulate(roofline, SchedulerConfig(), arrivals, 1024, 256, np.ones(40, dtype=bool))
    # Fewer sequences at a time: each decodes faster, but the queue waits longer for its turn.
    assert roomy.preemptions == 0 and roomy.ttft_ms.max() < result.ttft_ms.max()


def test_token_budget_and_running_limit_hold():
    roofline = Roofline(QWEN, stage_format(BF16, QWEN), device("h100-sxm"))
    limited = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512)
    arrivals = np.zeros(20)
    result = simulate(roofline, limited, arrivals, 1024, 16, np.ones(20, dtype=bool))
    assert result.max_running == 8
    # 1,024-token prompts in 512-token chunks: the first token needs two steps.
    alone = low_load(roofline, limited, Workload(prompt_tokens=1024, output_tokens=16))[0]
    one_step = low_load(roofline, SchedulerConfig(), Workload(prompt_tokens=1024, output_tokens=16))[0]
    assert alone > one_step


def test_latency_rises_with_rate_and_the_search_brackets_capacity():
    roofline = Roofline(QWEN, stage_format(W8A8_FP8, QWEN), device("h100-sxm"))
    workload, settings = Workload(prompt_tokens=1024, output_tokens=256), SimSettings(
        measured_requests=400, iterations=5)
    slow, fast = (at_rate(roofline, SchedulerConfig(), workload, rate, settings) for rate in (5, 40))
    assert slow.tpot_p99_ms < fast.tpot_p99_ms and slow.ttft_p99_ms < fast.ttft_p99_ms
    rate, how, trace = capacity(roofline, SchedulerConfig(), workload, settings)
    assert rate is not None and "passes" in how
    assert any(step.passed and step.rate == rate for step in trace)
    assert any(not step.passed and step.rate > rate for step in trace)
    # Seeded: the same settings give the same answer.
    assert capacity(roofline, SchedulerConfig(), workload, settings)[0] == rate


def test_workload_from_a_load_profile():
    profile = LoadProfile(high_users=4, prompt_tokens=128, output_tokens=32, requests=10,
                          slo={"ttft_ms": 500, "tpot_ms": 50})
    workload = workload_from_profile(profile)
    assert (workload.prompt_tokens, workload.output_tokens) == (128, 32)
    assert workload.slo.ttft_ms == 500 and workload.target == 0.99


# --- calibration on a described CPU (synthetic measurements) -------------------------------------

CPU = describe_device("cpu", tflops={"bf16": 2.0, "int8": 4.0}, bandwidth_gbs=40, memory_gib=8,
                      step_overhead_ms=2.0)
TRUE = CPU.model_copy(update={"efficiency": CPU.efficiency.model_copy(
    update={"compute": 0.3, "memory": 0.6})})
SMALL = Workload(prompt_tokens=256, output_tokens=32)
CPU_SCHEDULER = SchedulerConfig(kv_cache_gib=1.0, max_num_seqs=16, max_num_batched_tokens=2048)


def _measured(stage: dict) -> tuple[float, float]:
    return low_load(Roofline(SMOLLM2, stage_format(stage, SMOLLM2), TRUE), CPU_SCHEDULER, SMALL)


def test_calibration_recovers_the_knobs_and_predicts_other_stages():
    ttft, tpot = _measured(BF16)
    baseline = Baseline(prompt_tokens=256, output_tokens=32, ttft_ms=ttft, tpot_ms=tpot)
    fitted = calibrate(CPU, SMOLLM2, stage_format(BF16, SMOLLM2), baseline, CPU_SCHEDULER)
    assert fitted.efficiency.compute == pytest.approx(0.3, rel=1e-3)
    assert fitted.efficiency.memory == pytest.approx(0.6, rel=1e-3)
    assert fitted.efficiency.step_overhead_ms == 2.0
    for stage in (W8A8_INT8, W4A16):
        predicted = low_load(
            Roofline(SMOLLM2, stage_format(stage, SMOLLM2), fitted), CPU_SCHEDULER, SMALL)
        assert predicted == pytest.approx(_measured(stage), rel=1e-3)
    table = whatif_table({"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
                          "num_key_value_heads": 3, "intermediate_size": 1536,
                          "vocab_size": 49152, "tie_word_embeddings": True},
                         {"int8": W8A8_INT8}, [fitted], SMALL, CPU_SCHEDULER,
                         SimSettings(measured_requests=200, iterations=4))
    assert table.loc[0, "capacity_rps"] > 0 and table.loc[0, "gpu"] == "cpu"


def test_a_busy_measurement_fits_the_per_sequence_cost_too():
    import numpy as np

    from gates.whatif.scheduler import simulate

    true = TRUE.model_copy(update={"efficiency": TRUE.efficiency.model_copy(
        update={"sequence_ms": 1.5})})
    ttft, tpot = low_load(Roofline(SMOLLM2, stage_format(BF16, SMOLLM2), true), CPU_SCHEDULER,
                          SMALL)
    busy = simulate(Roofline(SMOLLM2, stage_format(BF16, SMOLLM2), true), CPU_SCHEDULER,
                    np.zeros(4), 256, 32, measured=np.ones(4, dtype=bool))
    baseline = Baseline(prompt_tokens=256, output_tokens=32, ttft_ms=ttft, tpot_ms=tpot,
                        busy_users=4, busy_tpot_ms=float(np.median(busy.tpot_ms)))
    fitted = calibrate(CPU, SMOLLM2, stage_format(BF16, SMOLLM2), baseline, CPU_SCHEDULER)
    assert fitted.efficiency.sequence_ms == pytest.approx(1.5, rel=1e-3)
    assert fitted.efficiency.compute == pytest.approx(0.3, rel=1e-3)
    assert fitted.efficiency.memory == pytest.approx(0.6, rel=1e-3)
    assert "1.5 ms per sequence" in fitted.efficiency.describe()
    # Without the busy level the same low-load figures read as a slower memory instead.
    two_knobs = calibrate(CPU, SMOLLM2, stage_format(BF16, SMOLLM2),
                          baseline.model_copy(update={"busy_users": None, "busy_tpot_ms": None}),
                          CPU_SCHEDULER)
    assert two_knobs.efficiency.sequence_ms == 0 and two_knobs.efficiency.memory < 0.6


def test_calibration_from_throughput_matches_latency_form():
    latency = Baseline(prompt_tokens=256, output_tokens=32, ttft_ms=200.0, tpot_ms=25.0)
    throughput = Baseline.from_throughput(256, 32, prefill_tokens_per_s=1280, decode_tokens_per_s=40)
    assert throughput == latency


def test_calibration_refuses_a_measurement_faster_than_peak():
    ttft, tpot = _measured(BF16)
    impossible = Baseline(prompt_tokens=256, output_tokens=32, ttft_ms=ttft / 10, tpot_ms=tpot)
    with pytest.raises(SpecError, match="faster than cpu's peak"):
        calibrate(CPU, SMOLLM2, stage_format(BF16, SMOLLM2), impossible, CPU_SCHEDULER)


def test_capacity_far_below_the_compute_ceiling_is_still_found():
    # A bandwidth-starved device with a big per-step cost: decode, not compute, sets capacity.
    slow = describe_device("slow", tflops={"bf16": 100.0}, bandwidth_gbs=100, memory_gib=40,
                           step_overhead_ms=15.0)
    roofline = Roofline(SMOLLM2, stage_format(BF16, SMOLLM2), slow)
    workload = Workload(prompt_tokens=256, output_tokens=64)
    settings = SimSettings(measured_requests=200, iterations=4)
    rate, how, trace = capacity(roofline, SchedulerConfig(max_num_seqs=4), workload, settings)
    assert rate is not None and rate < rate_ceiling(roofline, workload) / 40
    assert trace[0].passed is False  # the first bracket's low end failed, the search moved down


def test_no_capacity_when_a_lone_request_misses_the_slo():
    roofline = Roofline(QWEN, stage_format(BF16, QWEN), device("l40s"))
    strict = Workload(prompt_tokens=1024, output_tokens=64, slo={"tpot_ms": 10.0})
    rate, how, trace = capacity(roofline, SchedulerConfig(), strict)
    assert rate is None and "served alone misses the SLO" in how and not trace
