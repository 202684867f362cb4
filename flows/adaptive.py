"""Adaptive sample size: while accuracy (or output length) is inconclusive, score more items.

The stage's engine is still up; the baseline answers beside it (the engine the run kept up, or
served again on another port, the same cores) only for the items it has not answered yet, and
its stored record grows with them, so a later stage needing the same items finds them already
scored. Each batch multiplies the items of every set that still bears on the open rule by the
policy's `growth` (gates.accuracy.more_items says which), within the set's pool, up to `max_looks`
looks; the accuracy rule splits its alpha over those looks, so looking again cannot buy a false go.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from evalsets.contracts import fit_to_context
from evalsets.results import QualityItem, QualityResult, TaskQuality
from evalsets.runner import run_evalset, token_counter
from evalsets.spec import EvalSetSpec
from flows.engines import BASELINE_PORT_OFFSET, KeptEngines, engine_beside
from flows.plan import Stage
from flows.spec import Spec
from gates.accuracy import more_items
from gates.policy import GatePolicy, precision_class
from gates.record import StageRecord
from infra.engine import EngineFacts
from infra.placement import Placement
from infra.progress import progress


def _extend(task: TaskQuality, items: list[QualityItem]) -> None:
    known = {item.id for item in task.items}
    task.items += [item for item in items if item.id not in known]
    task.value = sum(item.score for item in task.items) / len(task.items)


def _score(facts: EngineFacts, spec: EvalSetSpec, start: int, stop: int, out_dir: Path,
           tokenizer_dir: Path, chat_template: bool, num_concurrent: int,
           structured_output: bool = False) -> list[QualityItem]:
    batch = spec.model_copy(update={"limit": stop - start})
    label = f"{out_dir.parent.name}: {spec.name} items {start + 1}-{stop}"
    with progress.task(label, stop - start) as advance:
        task = run_evalset(facts.base_url, facts.model, batch, out_dir,
                           token_counter(tokenizer_dir), chat_template, num_concurrent,
                           start=start, on_items=advance, structured_output=structured_output,
                           tokenizer_dir=tokenizer_dir)
    return task.items


def grow_until_decided(
    stage: Stage, quality: QualityResult, facts: EngineFacts, spec: Spec, baseline: Stage,
    results_dir: Path, policy: GatePolicy, pools: dict[str, int], num_concurrent: int,
    kept: KeptEngines | None = None, placement: Placement | None = None,
) -> QualityResult:
    """Score more items on the stage (and the baseline) until the pooled rule decides; on the
    baseline's engine the run `kept` up when it has one, else on the GPUs `placement` gives an
    engine beside the stage's."""
    baseline_folder = results_dir / baseline.name
    base_record = StageRecord.read(baseline_folder)
    if base_record.quality is None:
        return quality
    axes = stage.axes.model_dump(exclude={"emulated"})
    precision = precision_class(axes)
    parent = None
    if stage.parent != baseline.name:  # length is judged against the parent, as it was stored
        parent = StageRecord.read(results_dir / stage.parent).quality
    sets = {s.name: s for s in fit_to_context(spec.evalsets, facts.max_model_len)}
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        base_facts: EngineFacts | None = None
        while quality.looks < policy.quality.max_looks:
            sizes = more_items(quality, base_record.quality, precision, policy, pools, parent,
                               axes)
            if sizes is None:
                break
            quality.look_sizes.append({name: len(task.items)
                                       for name, task in quality.tasks.items()})
            quality.looks += 1
            # Not decided yet (accuracy or length): more items on the stage and the baseline.
            progress.line(f"stage {stage.name}: not decided yet, look {quality.looks} with "
                          + ", ".join(f"{name} {n} items" for name, n in sizes.items()))
            for name, wanted in sizes.items():
                base_task, task = base_record.quality.tasks[name], quality.tasks[name]
                if wanted > len(base_task.items):
                    if base_facts is None:
                        base_facts = stack.enter_context(engine_beside(
                            spec, baseline, baseline_folder / "engine-more-items.log",
                            BASELINE_PORT_OFFSET, kept, placement=placement))
                    _extend(base_task, _score(
                        base_facts, sets[name], len(base_task.items), wanted,
                        baseline_folder / "quality", baseline.checkpoint, spec.chat_template,
                        num_concurrent))
                before = len(task.items)
                if wanted > before:
                    _extend(task, _score(facts, sets[name], before, wanted,
                                         results_dir / stage.name / "quality", stage.checkpoint,
                                         spec.chat_template, num_concurrent,
                                         stage.structured_output))
                    quality.added_items[name] = quality.added_items.get(name, 0) + len(
                        task.items) - before
            base_record.save(baseline_folder)
            base_record.quality.save(baseline_folder / "quality")
    quality.added_s += time.monotonic() - started
    quality.save(results_dir / stage.name / "quality")
    return quality
