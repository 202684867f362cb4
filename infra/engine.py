"""The engine interface: a server you start (or find), probe for facts, and stop; and the
registry of engine kinds, each a module `infra/<kind>_engine.py` with its settings and its class."""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from infra.errors import EngineError, did_you_mean

if TYPE_CHECKING:
    from infra.cores import CorePlan

# The longest context a served model declares today is 10M tokens; beyond 2^24 a typo.
MAX_CONTEXT_TOKENS = 2**24
DEFAULT_KIND = "vllm"  # an engine without `kind` in a spec
# Every engine this process started, in order, as (stage served, log): a run records them.
STARTED: list[tuple[str, Path]] = []


class EngineFacts(BaseModel):
    """What the serving engine says about itself once it is healthy."""

    base_url: str = Field(description="OpenAI-compatible root, e.g. http://127.0.0.1:8100")
    model: str = Field(description="Served model name to put in requests.")
    command: list[str] = Field(default_factory=list, description="Exact command line that started it.")
    env: dict[str, str] = Field(default_factory=dict, description="Engine-relevant environment variables.")
    version: str | None = None
    kv_cache_tokens: int | None = Field(default=None, description="KV capacity in tokens (/metrics).")
    kv_cache_dtype: str | None = None
    kv_cache_skip_layers: list[int] | None = Field(
        default=None, description="Layers whose KV cache keeps the model dtype, as /metrics "
        "says (vLLM's kv_cache_dtype_skip_layers); None where it does not say.")
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
    kv_default_scales: bool = Field(
        default=False, description="An FP8 KV cache on vLLM's default scales (1.0, "
        "uncalibrated), as its start-up log says.")
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

    def serving(self, checkpoint: Path) -> EngineFacts:
        """These facts for the same engine serving the same bytes from `checkpoint` (a stage that
        takes another stage's measurement: the cache key holds the content, not the folder): the
        served model and the command name `checkpoint` where they named the other folder."""
        if self.model not in self.command:
            return self
        return self.model_copy(update={
            "model": str(checkpoint),
            "command": [str(checkpoint) if arg == self.model else arg for arg in self.command]})

    def command_line(self) -> str:
        """The command as one shell line, environment first, ready to paste."""
        import shlex

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = shlex.join(self.command)
        return f"{env} {cmd}".strip()


class EngineArgs(BaseModel):
    """One kind's settings, the spec's `engine:`; every question the rest of quantgate asks of
    an engine kind is a method here, so that no caller tells kinds apart by name."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: str
    # True: quantgate starts the server per stage (on `host`/`port`, from the stage's checkpoint).
    starts_server: ClassVar[bool] = True
    # True: the engine reports the configuration it serves (model, dtype, quantization, KV dtype,
    # load format), so the served check compares all of it; False: only what /metrics shows.
    reports_config: ClassVar[bool] = True

    def serving_device(self) -> str:
        """What the timings depend on: 'cpu', 'cuda', or 'external' (another host's)."""
        return "external"

    def axes_device(self) -> str:
        """The device whose build decides what an online quantization method serves."""
        return self.serving_device()

    def on_gpu(self) -> bool:
        """Whether the run's placement plan gives this engine GPUs (infra/placement.py)."""
        return False

    def placed(self, visible_devices: str, memory_share: float) -> EngineArgs:
        """These settings on the GPUs and memory share the placement plan gives an engine."""
        return self

    def fp8_kv_rounding(self) -> str:
        """How the engine rounds K and V into an FP8 cache, as a diagnosis emulates it
        (infra.sensitivity.fp8_round_trip): 'nearest' (ties to even, CUDA's conversion and
        torch's cast) unless the kind knows its own."""
        return "nearest"

    def keeps_engines(self) -> bool:
        """Whether this kind can keep a stage's engine up for later stages (cheap to hold, slow
        to start). On a GPU the run's placement plan decides whether it does (room for each)."""
        return False

    def for_sampling(self) -> EngineArgs:
        """These settings as a run with a sampled set (seeded requests) needs them."""
        return self

    def command(self, checkpoint: Path, flags: Any, python: str = "python",
                reveal: bool = False) -> tuple[list[str], dict[str, str]]:
        """The exact command and environment that serve `checkpoint` with a stage's `flags`."""
        raise EngineError(f"engine kind {self.kind!r} starts no server: it has no command")

    def cache_identity(self, stage: str, flags: Any) -> dict:
        """What of the engine goes into a stage's cache key: all that changes a measurement."""
        command, env = self.command(Path("CHECKPOINT"), flags)
        return {"kind": self.kind, "command": command, "env": env}

    def api_key(self) -> str | None:
        """The key quantgate's clients send the engine, or None."""
        return None

    def core_plan(self, usable: Any = None) -> CorePlan:
        """Which CPU cores the engine binds and which the load generator gets."""
        from infra.cores import plan_cores

        return plan_cores(self.serving_device(), None, usable)

    def check_stages(self, stages: list[tuple[str, str, bool]]) -> None:
        """Refuse settings that do not fit the spec's stages, given as (name, parent,
        serves_parent_again); raise ValueError. Default: nothing to check."""

    def check_gpus(self, stage: str, config: dict, gpus: list) -> None:
        """Refuse a stage's checkpoint (its config.json) that this kind cannot serve on the GPUs
        the run was given (infra/placement.Gpu); raise SpecError. Default: nothing to check."""

    def serves_apart(self, stage: str, other: str) -> bool:
        """Whether two stages are served by two engines (False: one server answers both)."""
        return True

    def check_extra_args(self, args: list[str]) -> None:
        """Refuse a stage's extra CLI arguments this kind sets itself; raise ValueError."""

    def config_source(self) -> str:
        """Why the served check could not read the engine's configuration: a sentence with
        `{missing}` where the keys it lacks go."""
        return "its report has no {missing}"


class Engine(ABC):
    """A running OpenAI-compatible server; use as a context manager."""

    kind: ClassVar[str]
    args: ClassVar[type[EngineArgs]]
    config_from: ClassVar[str] = "its start-up log"  # where served_config() reads, for messages

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

    @classmethod
    def served_config(cls, facts: EngineFacts, log_text: str) -> dict[str, str]:
        """What the running engine says it serves (model, dtype, quantization, kv_cache_dtype,
        load_format; values as it spells them), from its start-up log or its own API."""
        return {}


ENGINES: dict[str, type[Engine]] = {}


def register(cls: type[Engine]) -> type[Engine]:
    ENGINES[cls.kind] = cls
    return cls


def engine_kinds() -> dict[str, type[Engine]]:
    """Every engine kind, keyed by `kind`: each module `infra/<name>_engine.py` registers its
    own when imported, so adding a kind is adding its file."""
    import infra

    for module in pkgutil.iter_modules(infra.__path__):
        if module.name.endswith("_engine"):
            importlib.import_module(f"infra.{module.name}")
    return ENGINES


def engine_class(kind: str) -> type[Engine]:
    kinds = engine_kinds()
    if kind not in kinds:
        raise EngineError(f"unknown engine kind {kind!r}; {did_you_mean(kind, tuple(kinds))}")
    return kinds[kind]
