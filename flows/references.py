"""The stages a stage is measured against, and the engines kept up for them."""

from __future__ import annotations

from flows.plan import Stage, keep_until, reference_of
from flows.preflight import Prepared


def timed_against(stage: Stage, prepared: Prepared) -> Stage | None:
    """The stage a timed stage is raced against: its parent, or the nearest really-served
    ancestor. None: the stage is measured alone (the baseline, an emulated stage, or external
    engines that serve both from one URL)."""
    return reference_of(stage, prepared.stages, prepared.spec.engine)


def engines_to_keep(prepared: Prepared) -> dict[str, int]:
    """Stage name -> index of the last stage that may use its engine (flows/plan.py keep_until):
    the baseline's and each stage a later one is timed against. Where the engine kind can keep
    engines (vLLM, SGLang) and, on a GPU, where the placement plan has a slot for each of them
    beside the engines each stage starts (infra/keeping.py); else none."""
    engine = prepared.spec.engine
    if not engine.keeps_engines():
        return {}
    if engine.on_gpu() and not (prepared.placement and prepared.placement.kept):
        return {}
    return keep_until(prepared.stages, engine)
