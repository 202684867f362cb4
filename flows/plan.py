"""Turn a spec into ordered stages, each changing exactly one axis against its parent."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from flows.axes import REQUEST_CHANGES, Axes, derive_axes
from flows.spec import EngineFlags, Spec
from infra.checkpoint import read_config
from infra.digest import checkpoint_digest
from infra.engine import EngineArgs
from infra.errors import SpecError

# The first stage's name: a spec's stages may not take it (flows/spec.py), so a run folder's
# baseline is always `<run>/baseline/`.
BASELINE = "baseline"


class Stage(BaseModel):
    """A stage as it will be served: effective checkpoint + flags and the derived axes."""

    name: str
    kind: str = Field(
        description="'baseline', 'weights', 'activations', 'kv_cache', 'control' or "
        "'structured_output'."
    )
    parent: str | None
    checkpoint: Path
    engine_flags: EngineFlags
    axes: Axes
    changed: list[str] = Field(default_factory=list, description="Axes changed vs the parent.")
    request_options: dict[str, Any] = Field(
        default_factory=dict,
        description="What the stage adds to its parent's requests (a structured_output stage: "
        "response_format); its declared change when it changes no axis.")

    @property
    def structured_output(self) -> bool:
        """Eval items that declare a JSON Schema are asked for with it (guided decoding)."""
        return self.kind == "structured_output"

    @property
    def load_body(self) -> dict[str, Any]:
        """Fields every load request of this stage adds to the body."""
        return dict(self.request_options.get("load") or {})

    def fingerprint(self) -> str:
        """Identifies what is served, for the sign-off: the weights and config by content (not
        by path) and the engine flags."""
        flags = json.dumps(self.engine_flags.identity(), sort_keys=True).encode()
        weights = checkpoint_digest(self.checkpoint).encode()
        return hashlib.sha256(weights + flags).hexdigest()[:16]


# The small fixed schema every load request of a structured_output stage carries: an enum, an
# integer and a bounded string, so the grammar is compiled and masks every step until it closes.
LOAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"status": {"enum": ["ok", "late", "lost"]}, "count": {"type": "integer"},
                   "note": {"type": "string", "maxLength": 60}},
    "required": ["status", "count", "note"],
    "additionalProperties": False,
}


def request_options(kind: str) -> dict[str, Any]:
    """The request fields a stage kind adds (see Stage.request_options); {} for the others."""
    if kind != "structured_output":
        return {}
    return {
        "change": REQUEST_CHANGES[kind],
        "eval": "response_format json_schema: each item's own JSON Schema, on items that "
                "declare one",
        "load": {"response_format": {"type": "json_schema", "json_schema": {
            "name": "quantgate_load", "schema": LOAD_SCHEMA}}},
    }


def _merge(parent: EngineFlags, override: EngineFlags | None) -> EngineFlags:
    if override is None:
        return parent.model_copy(deep=True)
    merged = parent.model_dump() | override.model_dump(exclude_unset=True)
    return EngineFlags.model_validate(merged)


# The declared coupled change: online W8A8 quantizes weights and activations in one flag.
COUPLED = {"weights_activations": ["weights", "activations"]}
ONE_AT_A_TIME = ("put a weights-only stage before it (for online FP8: an FP8 weight-only "
                 "checkpoint, `quantgate prepare-candidates fp8-tensor`), or declare kind "
                 "weights_activations to accept weights and activations at once")


def _axes(stage_name: str, checkpoint: Path, flags: EngineFlags, device: str) -> Axes:
    try:
        return derive_axes(read_config(checkpoint), flags.model_dump(), device)
    except SpecError as err:
        raise SpecError(f"stage {stage_name!r}: {err}") from err


def plan(spec: Spec) -> list[Stage]:
    """Baseline first, then each stage; refuse a stage that changes zero or several axes
    (a control stage changes none: it serves its parent again; a structured_output stage
    serves it again too, asked with guided decoding)."""
    base_flags = spec.baseline.engine_flags
    # Axes as the engine's build serves them; an external server is taken to be a CUDA vLLM.
    device = spec.engine.axes_device()
    stages = {
        BASELINE: Stage(
            name=BASELINE,
            kind="baseline",
            parent=None,
            checkpoint=spec.baseline.checkpoint,
            engine_flags=base_flags,
            axes=_axes("baseline", spec.baseline.checkpoint, base_flags, device),
        )
    }
    if stages[BASELINE].axes.weights != "none" or stages[BASELINE].axes.activations != "none":
        raise SpecError(
            f"baseline must be unquantized, but it serves {stages[BASELINE].axes.describe()}"
        )
    for item in spec.stages:
        parent = stages[item.parent]
        checkpoint = item.checkpoint or parent.checkpoint
        flags = _merge(parent.engine_flags, item.engine_flags)
        axes = _axes(item.name, checkpoint, flags, device)
        changed = axes.differences(parent.axes)
        if item.kind in ("control", "structured_output"):
            # The exceptions to the one-change rule: the parent again, to measure the noise, or
            # asked with guided decoding (the change is in the requests, not in what is served).
            stages[item.name] = Stage(name=item.name, kind=item.kind, parent=parent.name,
                                      checkpoint=checkpoint, engine_flags=flags, axes=axes,
                                      request_options=request_options(item.kind))
            continue
        if not changed:
            raise SpecError(
                f"stage {item.name!r} changes no axis against its parent {parent.name!r} "
                f"(both serve {axes.describe()}); a stage must change exactly one axis"
            )
        detail = "; ".join(
            f"{axis}: {getattr(parent.axes, axis)} -> {getattr(axes, axis)}" for axis in changed
        )
        if item.kind in COUPLED:
            if changed != COUPLED[item.kind]:
                extra = [axis for axis in changed if axis not in COUPLED[item.kind]]
                hint = (f"; move the {', '.join(extra)} change to a stage of its own after it"
                        if extra else "")
                raise SpecError(
                    f"stage {item.name!r} is declared kind {item.kind!r} (weights and "
                    f"activations at once) but what it serves changes {', '.join(changed)} "
                    f"against its parent {parent.name!r} ({detail}){hint}")
        elif len(changed) > 1:
            coupled = COUPLED["weights_activations"]
            hint = "split it into one stage per axis"
            if changed[:2] == coupled:  # online W8A8, perhaps with a KV cache flag too
                rest = changed[2:]
                hint = ONE_AT_A_TIME + (f"; and the {', '.join(rest)} change in a stage of its "
                                        "own after it" if rest else "")
            raise SpecError(
                f"stage {item.name!r} changes {len(changed)} axes against its parent "
                f"{parent.name!r} ({detail}); a stage must change exactly one axis: {hint}"
            )
        elif changed[0] != item.kind and item.kind != "repair":
            raise SpecError(
                f"stage {item.name!r} is declared kind {item.kind!r} but what it serves changes "
                f"{changed[0]} ({getattr(parent.axes, changed[0])} -> {getattr(axes, changed[0])})"
            )
        stages[item.name] = Stage(
            name=item.name,
            kind=item.kind,
            parent=parent.name,
            checkpoint=checkpoint,
            engine_flags=flags,
            axes=axes,
            changed=changed,
        )
    return list(stages.values())


def searches_capacity(stage: Stage, stages: list[Stage], capacity: dict) -> bool:
    """Whether `stage`'s load includes the capacity search: the baseline's and the final
    candidate's do (the figures a release reads); stages that only lead to the candidate skip
    it unless the profile asks for every stage."""
    if not capacity.get("enabled"):
        return False
    return bool(capacity.get("every_stage")) or stage is stages[0] or stage is stages[-1]


def reference_of(stage: Stage, stages: list[Stage], engine: EngineArgs | None = None) -> Stage | None:
    """The stage `stage` is timed against: its parent, or past emulated ones the nearest
    really-served ancestor. None: the stage is measured alone (the baseline, an emulated stage,
    or an `engine` that serves both from one server: external ones from one URL)."""
    if stage.parent is None or stage.axes.emulated:
        return None
    by_name = {s.name: s for s in stages}
    reference = by_name[stage.parent]
    while reference.axes.emulated and reference.parent is not None:
        reference = by_name[reference.parent]
    if engine is not None and not engine.serves_apart(stage.name, reference.name):
        return None
    return reference


def keep_until(stages: list[Stage], engine: EngineArgs) -> dict[str, int]:
    """Stage name -> index of the last stage that may use its engine, where a run keeps engines
    up: the baseline's to the last stage (adaptive looks score more of its items, timed stages
    race it), and each stage a later one is timed against until that one."""
    if len(stages) < 2:
        return {}
    keep = {stages[0].name: len(stages) - 1}
    for index, stage in enumerate(stages):
        reference = reference_of(stage, stages, engine)
        if reference is not None:
            keep[reference.name] = max(keep.get(reference.name, 0), index)
    return keep
