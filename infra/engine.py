"""The engine interface: a server you start (or find), probe for facts, and stop."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from pydantic import BaseModel, Field

from infra.errors import EngineError, did_you_mean


class EngineFacts(BaseModel):
    """What the serving engine says about itself once it is healthy."""

    base_url: str = Field(description="OpenAI-compatible root, e.g. http://127.0.0.1:8100")
    model: str = Field(description="Served model name to put in requests.")
    command: list[str] = Field(default_factory=list, description="Exact command line that started it.")
    env: dict[str, str] = Field(default_factory=dict, description="Engine-relevant environment variables.")
    version: str | None = None
    kv_cache_tokens: int | None = Field(default=None, description="KV capacity in tokens (/metrics).")
    kv_cache_dtype: str | None = None
    kv_cache_bytes: int | None = None
    weight_bytes: int | None = Field(default=None, description="Checkpoint size on disk.")
    kv_cache_tokens_from: str | None = Field(
        default=None, description="Where kv_cache_tokens was read: the kv_cache_size_tokens "
        "label, num_gpu_blocks x block_size, or the start-up log.")
    weight_memory_bytes: int | None = Field(
        default=None, description="Device memory the loaded weights took (the log's 'Model "
        "loading took X GiB', summed over ranks): right for online quantization and TP.")
    quantization: str | None = Field(default=None, description="The method the engine ran.")
    linear_kernels: list[str] = Field(default_factory=list,
                                      description="'Kernel for Method' as the log names them.")
    fp8_marlin_fallback: bool = Field(
        default=False, description="FP8 weights through Marlin on a GPU without FP8 units: "
        "weight-only, activations unquantized.")
    attention_backend: str | None = None
    max_model_len: int | None = None
    startup_s: float | None = Field(default=None, description="Seconds from launch to healthy.")
    pid: int | None = Field(default=None, description="The engine's process, when this run "
                            "started it (its CPU is the run's own, not contention).")

    def kernels(self) -> str | None:
        """The kernels as one line (None when the engine did not say)."""
        if not (self.linear_kernels or self.attention_backend or self.fp8_marlin_fallback):
            return None
        from infra.vllm_facts import kernel_summary

        return kernel_summary(self.quantization, self.linear_kernels, self.fp8_marlin_fallback,
                              self.attention_backend)

    def ready_line(self) -> str:
        """How the engine came to answer, for the run log: 'healthy in 27.3 s' when this run
        started it, 'already running at URL' for an external server (nothing was started, so
        there is no start-up time); then its KV capacity, or that it did not say."""
        from infra.secrets import redact

        ready = (f"healthy in {self.startup_s:g} s" if self.startup_s is not None
                 else f"already running at {redact(self.base_url)} (not started by this run)")
        kv = (f"KV {self.kv_cache_tokens:,} tokens" if self.kv_cache_tokens is not None
              else "KV capacity not reported")
        return f"{ready}, {kv}"

    def command_line(self) -> str:
        """The command as one shell line, environment first, ready to paste."""
        import shlex

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = shlex.join(self.command)
        return f"{env} {cmd}".strip()


class Engine(ABC):
    """A running OpenAI-compatible server; use as a context manager."""

    kind: ClassVar[str]

    @abstractmethod
    def start(self) -> EngineFacts: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> EngineFacts:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


ENGINES: dict[str, type[Engine]] = {}


def register(cls: type[Engine]) -> type[Engine]:
    ENGINES[cls.kind] = cls
    return cls


def engine_class(kind: str) -> type[Engine]:
    # Importing here registers the built-in kinds without import-time side effects elsewhere.
    from infra import external_engine, vllm_engine  # noqa: F401

    if kind not in ENGINES:
        raise EngineError(f"unknown engine kind {kind!r}; {did_you_mean(kind, tuple(ENGINES))}")
    return ENGINES[kind]
