"""Adaptive sample size: while accuracy (or output length) is inconclusive, score more items.

The stage's engine is still up; the baseline answers beside it (the engine the run kept up, or
served again on another port, the same cores) only for the items it has not answered yet. Those
are a record of their own in the baseline's folder (`more/more_items.json`, evalsets.results
MoreItems), never a rewrite of its quality.json; a later stage needing the same items finds them
already scored (gates.record reads both). A stage of a chain is judged on length against its
parent: the parent is served again beside it the same way (`parent_stage`), so that length can
grow past the parent's stored answers rather than stay inconclusive at the first look's size;
its more items are its own record too, and its own verdict stays on its own items. Each batch
multiplies the items of every set that still bears on the open rule by the policy's `growth`
(gates.accuracy.next_look says which, and the look's line names the rules each set grows for),
within the set's pool, up to `max_looks` looks; the accuracy rule splits its alpha over those
looks, so looking again cannot buy a false go. A set whose only open rules are some of its
groups (a KV stage's long-context buckets) grows those groups alone; a grouped set grows group
by group in any case (each group's next items, `_score_more`), so every engine holds each
group's first items and a later look, or a later stage, asks only for what is missing.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from evalsets.contracts import fit_to_context, requests_in_flight
from evalsets.results import MoreItems, QualityItem, QualityResult, TaskQuality
from evalsets.runner import run_evalset, token_counter
from evalsets.spec import EvalSetSpec
from flows.engines import BASELINE_PORT_OFFSET, PARENT_PORT_OFFSET, KeptEngines, engine_beside
from flows.plan import Stage
from flows.power import group_order
from flows.spec import Spec
from gates.accuracy import Look, checks_at_look, group_counts, next_look, reach_of
from gates.length import length_checks
from gates.noninferiority import look_alpha
from gates.policy import GatePolicy, precision_class
from gates.record import StageRecord
from infra.engine import EngineFacts
from infra.placement import Placement
from infra.progress import progress


def _score(facts: EngineFacts, spec: EvalSetSpec, start: int, stop: int, out_dir: Path,
           tokenizer_dir: Path, chat_template: bool, num_concurrent: int,
           structured_output: bool = False, group: str | None = None) -> list[QualityItem]:
    """Items [start, stop) of the set, or with `group` of that group's own items (raw results
    then in a folder of the group's own)."""
    what = spec.name if group is None else f"{spec.name} {group}"
    label = f"{out_dir.parent.name}: {what} items {start + 1}-{stop}"
    if group is not None:
        spec = spec.model_copy(update={"groups": [group]})
        out_dir = out_dir / f"{spec.name}-{group}"
    batch = spec.model_copy(update={"limit": stop - start})
    samples = spec.sampling.samples if spec.sampling else 1
    in_flight = requests_in_flight(spec, num_concurrent, facts.kv_cache_tokens)
    with progress.task(label, (stop - start) * samples) as advance:
        task = run_evalset(facts.base_url, facts.model, batch, out_dir,
                           token_counter(tokenizer_dir), chat_template, in_flight,
                           start=start, on_items=advance, structured_output=structured_output,
                           tokenizer_dir=tokenizer_dir)
    return task.items


def group_targets(look: Look, name: str, wanted: int, order: list[str] | None,
                  items: list[QualityItem]) -> dict[str, int] | None:
    """Each group's items the set should have after the look, or None where the set grows as a
    prefix of its pool (no groups). A set the look grows by group gets its groups' targets; a
    grouped set it grows as a whole gets, per group, as many as the pool's first `wanted` items
    hold, so its items stay each group's first items on every stage, whichever way it grew."""
    if name in look.groups:
        return look.groups[name]
    if not order or not group_counts(items):
        return None
    return dict(Counter(order[:wanted]))


def _has(task: TaskQuality, group: str | None) -> int:
    """The items an engine holds of the set (`group` None: its prefix) or of one group."""
    return len(task.items) if group is None else group_counts(task.items).get(group, 0)


def _score_more(engine: Callable[[], EngineFacts], spec: EvalSetSpec, group: str | None,
                task: TaskQuality, want: int, out_dir: Path, tokenizer_dir: Path,
                chat_template: bool, num_concurrent: int,
                structured_output: bool = False) -> list[QualityItem]:
    """The set's next items on one engine, up to `want` (`group` None: of the set's own order,
    else of that group's): appended to `task` and returned. None are asked, and the `engine`
    (a callable that serves it) is not started, when the task has them already."""
    have = _has(task, group)
    if want <= have:
        return []
    by_group = {} if group is None else {"group": group}
    more = _score(engine(), spec, have, want, out_dir, tokenizer_dir, chat_template,
                  num_concurrent, structured_output, **by_group)
    task.extend(more)
    return more


def so_far(stage: Stage, quality: QualityResult) -> StageRecord:
    """The stage's record as measured so far (its quality alone), for the rules that can end the
    looks early."""
    return StageRecord(name=stage.name, kind=stage.kind, parent=stage.parent, quality=quality,
                       axes=stage.axes.model_dump(exclude={"emulated"}))


def length_fails_for_good(stage: Stage, quality: QualityResult, parent: StageRecord,
                          baseline: StageRecord, policy: GatePolicy) -> list[str]:
    """The required length rules the stage already fails at one look's share of alpha: its
    verdict is a rollback whatever more items say of accuracy, so another look only spends engine
    time. The stricter level (the accuracy rule's per-look alpha) keeps the chance that stopping
    here turns a stage within the limit into a rollback below that share."""
    if not policy.length.required:
        return []
    q = policy.quality
    strict = policy.model_copy(update={"quality": q.model_copy(
        update={"alpha": look_alpha(q.alpha, q.max_looks)})})
    return [c.rule for c in length_checks(so_far(stage, quality), parent, strict, baseline)
            if c.rule in ("length", "length.baseline") and c.status == "fail"]


def accuracy_fails_for_good(stage: Stage, quality: QualityResult, parent: StageRecord,
                            baseline: StageRecord, policy: GatePolicy) -> list[str]:
    """The accuracy rules the stage fails on this look's interval: the first look that decides a
    rule is its verdict (gates.accuracy.quality_checks), so more items cannot undo the rollback
    and another look (for length, or another set) would only spend engine time."""
    return [c.rule for c in checks_at_look(so_far(stage, quality), parent, baseline, policy)
            if c.status == "fail" and not c.passed and "ci_low" in c.details
            and not c.details.get("sets_too_small")]


def grow_until_decided(
    stage: Stage, quality: QualityResult, facts: EngineFacts, spec: Spec, baseline: Stage,
    results_dir: Path, policy: GatePolicy, pools: dict[str, int], num_concurrent: int,
    kept: KeptEngines | None = None, parent_stage: Stage | None = None,
    placement: Placement | None = None,
) -> QualityResult:
    """Score more items on the stage (and the baseline, and a parent that is not the baseline
    when `parent_stage` says how to serve it) until the pooled rule decides; on the engines the
    run `kept` up when it has them, else on the GPUs `placement` gives an engine beside the
    stage's (one at a time there: the plan has one place beside it)."""
    baseline_folder = results_dir / baseline.name
    base_record = StageRecord.read(baseline_folder)
    if base_record.quality is None:
        return quality
    axes = stage.axes.model_dump(exclude={"emulated"})
    precision = precision_class(axes)
    parent_record = None
    if stage.parent != baseline.name:  # length is judged against the parent
        parent_record = StageRecord.read(results_dir / stage.parent)
    parent = parent_record.quality if parent_record is not None else None
    served = parent_stage is not None and parent is not None
    base_more = MoreItems.kept(baseline_folder) or MoreItems()
    parent_folder = results_dir / stage.parent
    parent_more = (MoreItems.kept(parent_folder) or MoreItems()) if served else None
    sets = {s.name: s for s in fit_to_context(spec.evalsets, facts.max_model_len)}
    orders: dict[str, list[str]] = {}  # each grouped set's pool order, read at the first look

    def group_pools() -> dict[str, dict[str, int]]:
        if not orders:
            orders.update({name: order for name, s in sets.items() if (order := group_order(s))})
        return {name: dict(Counter(order)) for name, order in orders.items()}

    if not quality.reach:  # what each set and group can reach holds its own margin at every look
        first = quality.look_sizes[0] if quality.look_sizes else {
            name: len(task.items) for name, task in quality.tasks.items()}
        quality.reach = reach_of(first, pools, group_pools(), policy)
    started = time.monotonic()
    beside: dict[str, tuple[EngineFacts, contextlib.ExitStack]] = {}

    def serve(who: Stage, log_path: Path, offset: int) -> EngineFacts:
        """`who`'s engine beside the stage; on a planned GPU host the other one beside it stops
        first, so that no more engines are up than the plan placed."""
        if who.name not in beside:
            if placement is not None:
                for _, other in beside.values():
                    other.close()
                beside.clear()
            stack = contextlib.ExitStack()
            facts_of = stack.enter_context(engine_beside(spec, who, log_path, offset, kept,
                                                         placement=placement))
            beside[who.name] = (facts_of, stack)
        return beside[who.name][0]

    try:
        while quality.looks < policy.quality.max_looks:
            decided = accuracy_fails_for_good(stage, quality, parent_record or base_record,
                                              base_record, policy) + length_fails_for_good(
                stage, quality, parent_record or base_record, base_record, policy)
            if decided:
                progress.line(f"stage {stage.name}: already fails {', '.join(decided)} at one "
                              "look's alpha, which more items would not undo: no more looks")
                break
            look = next_look(quality, base_record.quality, precision, policy, pools, parent,
                             axes, parent_served=served, group_pools=group_pools())
            if look is None:
                break
            sizes = look.sizes
            quality.look_sizes.append({name: len(task.items)
                                       for name, task in quality.tasks.items()})
            quality.looks += 1
            # Not decided yet (accuracy or length): more items on the stage and the baseline,
            # each growing set named with the open rules it grows for.
            progress.line(f"stage {stage.name}: not decided yet, look {quality.looks} with "
                          + look.line())
            for name, wanted in sizes.items():
                if name not in look.reasons:  # not growing at this look
                    continue
                base_task, task = base_record.quality.tasks[name], quality.tasks[name]
                parent_task = parent.tasks.get(name) if served else None
                targets = group_targets(look, name, wanted, orders.get(name), task.items)
                for group, want in ([(None, wanted)] if targets is None else targets.items()):
                    more = _score_more(lambda: serve(baseline, baseline_folder / "engine-more-items.log",
                                                     BASELINE_PORT_OFFSET),
                                       sets[name], group, base_task, want,
                                       baseline_folder / MoreItems.FOLDER,
                                       baseline.checkpoint, spec.chat_template, num_concurrent)
                    if more:
                        base_more.add(name, more, stage.name)
                        base_more.keep(baseline_folder)
                    if parent_task is not None:
                        more = _score_more(lambda: serve(parent_stage,
                                                         parent_folder / "engine-more-items.log",
                                                         PARENT_PORT_OFFSET),
                                           sets[name], group, parent_task, want,
                                           parent_folder / MoreItems.FOLDER,
                                           parent_stage.checkpoint, spec.chat_template,
                                           num_concurrent, parent_stage.structured_output)
                        if more:
                            parent_more.add(name, more, stage.name)
                            parent_more.keep(parent_folder)
                    more = _score_more(lambda: facts, sets[name], group, task, want,
                                       results_dir / stage.name / "quality", stage.checkpoint,
                                       spec.chat_template, num_concurrent,
                                       stage.structured_output)
                    if more:
                        quality.added_items[name] = quality.added_items.get(name, 0) + len(more)
    finally:
        for _, stack in beside.values():
            stack.close()
    quality.added_s += time.monotonic() - started
    quality.save(results_dir / stage.name / "quality")
    return quality
