"""One stage of a run: not measured (its parent failed), from the cache, or its engine started,
measured (quality, then speed alone or against its reference) and stored."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from prefect import get_run_logger

from evalsets.results import QualityResult
from evalsets.runner import load_task_config
from flows.axes import weight_mix
from flows.engines import REFERENCE_PORT_OFFSET, KeptEngines, engine_beside, spec_port_free
from flows.plan import Stage, searches_capacity
from flows.preflight import Prepared
from flows.references import timed_against
from flows.run_context import RunContext
from flows.settings import Settings
from flows.tasks import measure_load, measure_paired_load, measure_quality
from flows.timing import stage_timings, timed, utc_now
from gates.comparability import (
    Comparability,
    SetSettings,
    chat_template_hash,
    generation_settings,
    profile_hash,
    tokenizer_hash,
)
from gates.record import StageRecord
from infra.checkpoint import model_shape, read_config
from infra.cores import plan_for
from infra.engine import STARTED, EngineFacts, engine_class
from infra.errors import EngineError, GpuBusyError, MeasurementError, PortInUseError
from load.prompts import bind, describe, source_digest


def measure_one(stage: Stage, run: RunContext) -> StageRecord:
    """One stage: not measured (its parent failed), from the cache, or served and measured (its
    engine left serving in `run.kept` when a later stage may use it)."""
    logger = get_run_logger()
    cache, parts, keys = run.cache, run.parts, run.keys
    results_dir, manifest, tracker = run.results_dir, run.manifest, run.tracker
    folder = results_dir / stage.name
    manifest.stages.append(stage.name)
    manifest.save(results_dir)
    parent = run.records.get(stage.parent) if stage.parent else None
    with tracker.stage_run(run.prepared.spec.candidate, stage.name, stage.kind):
        if parent is not None and parent.error:
            record = not_measured(stage, parent)
            record.save(folder)
        elif (stage.kind != "control" and not run.no_cache
              and cache.restore(keys[stage.name], folder)):
            run.reused.add(stage.name)
            manifest.reused[stage.name] = keys[stage.name]
            logger.info("stage %s: measured before, taken from the cache (%s)", stage.name,
                        keys[stage.name][:12])
            record = StageRecord.read(folder)
            if (record.name, record.kind, record.parent) != (stage.name, stage.kind, stage.parent):
                # Another stage's measurement of the same key (weights, config, engine, sets,
                # parent): a repair built as the W8A16 twin's bytes is that stage, measured.
                logger.info("stage %s: the same as stage %s of run %s", stage.name, record.name,
                            record.measured_in)
                record.name, record.kind, record.parent = stage.name, stage.kind, stage.parent
                if record.facts is not None:
                    record.facts = record.facts.serving(stage.checkpoint)
                record.save(folder)
        else:
            try:
                record = measure_stage(stage, run, keep=stage.name in run.keep_until)
            except BaseException:
                if (folder / "stage.json").exists():  # what it got before it broke
                    tracker.log_stage(StageRecord.read(folder), folder)
                raise
            record.cache_key = keys[stage.name]
            record.save(folder)
            if record.error is None and stage.kind != "control":
                cache.store(keys[stage.name], parts[stage.name], folder)
        tracker.log_stage(record, folder, cached=stage.name in run.reused)
    return record


def measure_stage(stage: Stage, run: RunContext, keep: bool = False) -> StageRecord:
    """Serve and measure one stage; the engines it started go into the manifest, also when
    the stage raises (a baseline that cannot start)."""
    results_dir, manifest = run.results_dir, run.manifest
    before = len(STARTED)
    folder = results_dir / stage.name
    try:
        record = run_stage(stage, run.prepared, folder, run.settings, run.reused, run.kept, keep)
    finally:
        manifest.engine_starts += [f"{served} ({log.relative_to(results_dir)})"
                                   for served, log in STARTED[before:]
                                   if log.is_relative_to(results_dir)]
        manifest.save(results_dir)
    record.measured_in = results_dir.name
    record.measured_at = utc_now()
    return record


def new_record(stage: Stage, **fields) -> StageRecord:
    """A stage's record before anything is measured: what is served, read from its checkpoint
    (its shape and, for a mixed checkpoint, each weight format's share) and its plan."""
    config = read_config(stage.checkpoint)
    return StageRecord(
        name=stage.name, kind=stage.kind, parent=stage.parent,
        axes=stage.axes.model_dump(exclude={"emulated"}), emulated=stage.axes.emulated,
        changed=stage.changed, fingerprint=stage.fingerprint(), shape=model_shape(config),
        weight_mix=weight_mix(config), request_options=stage.request_options or None, **fields)


def not_measured(stage: Stage, parent: StageRecord) -> StageRecord:
    return new_record(stage, error=f"not measured: its parent {parent.name} did not finish "
                      f"({parent.error})"[:2000])


def run_stage(stage: Stage, prepared: Prepared, folder: Path, settings: Settings,
              reused: set[str], kept: KeptEngines | None = None, keep: bool = False) -> StageRecord:
    """Start the engine, measure, stop; a failed measurement is kept as the stage's error.

    `reused`: stages restored from the cache in this run (their engines are not up to race).
    `keep`: a stage measured without error leaves its engine serving in `kept` for later stages.
    """
    from flows.served import check_served

    logger = get_run_logger()
    started, clock = time.monotonic(), {}
    record = new_record(stage)
    spec = prepared.spec
    engine = engine_class(spec.engine.kind)(
        spec_port_free(spec, kept, prepared.placement, stage.name), stage.checkpoint,
        stage.engine_flags, folder / "engine.log", stage.name
    )
    logger.info("stage %s: starting engine (%s)", stage.name, stage.axes.describe(stage.kind))
    died = False  # the engine had exited when a measurement failed (asked before it is stopped)
    try:
        with contextlib.ExitStack() as own:
            facts = own.enter_context(engine)
            record.facts = facts
            logger.info("stage %s: %s", stage.name, facts.ready_line())
            try:
                # What the engine says it serves must be what the axes say, before measuring.
                check_served(stage, facts, spec.engine, folder / "engine.log")
                record.quality = measure_quality(facts, stage, spec, folder, settings, prepared,
                                                 clock, kept)
                if stage.axes.emulated:
                    # Dequantized weights served as bf16: their speed is not the format's.
                    # Quality measured; speed predicted for the target GPU (gates/whatif).
                    logger.info("stage %s: emulated, so no load (speed is predicted)", stage.name)
                else:
                    measure_speed(stage, prepared, facts, folder, record, reused, clock, kept)
            except MeasurementError:
                died = getattr(engine, "alive", lambda: True)() is False
                raise
            if keep and kept is not None:
                kept.hold(stage.name, engine, facts, own.pop_all())
    except MeasurementError as err:
        record.error = str(err)
        if record.facts is not None and died:
            record.error = f"the engine died during the stage (log {folder / 'engine.log'}): {err}"
        logger.error("stage %s: %s", stage.name, record.error)
    except EngineError as err:
        if record.facts is None and (stage.parent is None or
                                     isinstance(err, (PortInUseError, GpuBusyError))):
            record.error = str(err)  # no baseline, a busy port or GPU: nothing can be judged
            record.timings = stage_timings(record, clock, time.monotonic() - started)
            record.save(folder)
            raise
        # The candidate's own fault: vLLM cannot serve it (or died under it). A verdict, not an
        # error: rollback, with the reason.
        record.error = f"not servable: {err}" if record.facts is None else str(err)
        logger.error("stage %s: %s", stage.name, record.error)
    record.comparability = asked(stage, prepared, record.quality)
    record.timings = stage_timings(record, clock, time.monotonic() - started)
    record.save(folder)
    return record


def measure_speed(stage: Stage, prepared: Prepared, facts: EngineFacts, folder: Path,
                  record: StageRecord, reused: set[str], clock: dict[str, float],
                  kept: KeptEngines | None = None) -> None:
    """Load levels (and capacity search), alone or in rounds against the reference beside it."""
    logger = get_run_logger()
    spec = prepared.spec
    profile = bind(prepared.profile, prepared.load_prompts, folder / "load")
    if profile.capacity.enabled and not searches_capacity(
            stage, prepared.stages, profile.capacity.model_dump()):
        logger.info("stage %s: no capacity search (only the baseline and the final candidate; "
                    "capacity.every_stage asks for all)", stage.name)
        profile = profile.model_copy(update={
            "capacity": profile.capacity.model_copy(update={"enabled": False})})
    reference = timed_against(stage, prepared)
    if reference is not None and reference.name in reused and \
            not prepared.policy.latency.required:
        # Racing a cached reference would serve it again for an advisory rule only.
        logger.info("stage %s: %s is from the cache; timed alone (latency is advisory)",
                    stage.name, reference.name)
        reference = None
    if reference is None:
        with timed(clock, "load"):
            record.load = measure_load(facts, profile, folder,
                                       plan_for(spec.engine), stage.load_body or None)
    else:
        # Both engines up at once, loaded in alternating rounds: drift between runs hits
        # both sides of a round alike (load/README.md).
        how = "its engine kept up" if kept is not None and reference.name in kept.names() \
            else "starting it"
        logger.info("stage %s: timed against %s beside it in interleaved rounds (%s)", stage.name,
                    reference.name, how)
        with engine_beside(spec, reference, folder / "reference-engine.log",
                           REFERENCE_PORT_OFFSET, kept, prepared.placement) as reference_facts, \
                timed(clock, "load"):
            clock["reference_startup"] = reference_facts.startup_s or 0.0
            record.load, record.paired_load = measure_paired_load(
                facts, reference_facts, reference, profile, folder,
                plan_for(spec.engine), stage.load_body or None, salt=stage.name,
                policy=prepared.policy)


def asked(stage: Stage, prepared: Prepared, quality: QualityResult | None) -> Comparability:
    """What the stage was served and sent, for the comparability rule: its checkpoint's chat
    template and tokenizer, each set's generation settings and first-look items, the load profile."""
    spec, profile = prepared.spec, prepared.profile
    sets = {}
    for evalset in spec.evalsets:
        task = quality.tasks.get(evalset.name) if quality is not None else None
        if task is not None:
            first_look = len(task.items) - quality.added_items.get(evalset.name, 0)
            sets[evalset.name] = SetSettings(
                generation=generation_settings(load_task_config(evalset)), items=first_look)
    return Comparability(
        chat_template=chat_template_hash(stage.checkpoint, spec.chat_template),
        tokenizer=tokenizer_hash(stage.checkpoint), sets=sets,
        load_profile=profile_hash(profile.model_dump(mode="json"), source_digest(profile.prompts)),
        load_prompts=describe(profile, prepared.load_prompts))
