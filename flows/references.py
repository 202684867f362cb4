"""The stages a stage is measured against, and the engines kept up for them."""

from __future__ import annotations

from flows.plan import Stage
from flows.preflight import Prepared


def timed_against(stage: Stage, prepared: Prepared) -> Stage | None:
    """The stage a timed stage is raced against: its parent, or the nearest really-served
    ancestor. None: the stage is measured alone (the baseline, an emulated stage, or external
    engines that serve both from one URL)."""
    if stage.parent is None or stage.axes.emulated:
        return None
    stages = {s.name: s for s in prepared.stages}
    reference = stages[stage.parent]
    while reference.axes.emulated and reference.parent is not None:
        reference = stages[reference.parent]
    if not prepared.spec.engine.serves_apart(stage.name, reference.name):
        return None
    return reference


def engines_to_keep(prepared: Prepared) -> dict[str, int]:
    """Stage name -> index of the last stage that may use its engine: the baseline's (adaptive
    looks score more of its items, timed stages race it) and each stage a later one is timed
    against. Where the engine kind keeps engines (vllm-cpu): on a GPU a third engine beside two
    may not fit in memory."""
    engine, stages = prepared.spec.engine, prepared.stages
    if not engine.keeps_engines() or len(stages) < 2:
        return {}
    keep = {stages[0].name: len(stages) - 1}
    for index, stage in enumerate(stages):
        reference = timed_against(stage, prepared)
        if reference is not None:
            keep[reference.name] = max(keep.get(reference.name, 0), index)
    return keep
