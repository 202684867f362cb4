"""The Prefect flow `acceptance`: baseline first, then one change at a time, then the gates."""

from __future__ import annotations

import contextlib
import datetime
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from evalsets.contracts import check_chat_template, check_prompts_fit, fit_to_context, validate_sets
from evalsets.results import QualityResult
from evalsets.runner import load_task_config, run_quality
from evalsets.structured import check_schema_items
from flows.adaptive import grow_until_decided
from flows.cache import StageCache, digest, stage_keys
from flows.engines import (
    REFERENCE_PORT_OFFSET,
    KeptEngines,
    engine_beside,
    kv_tokens_needed,
    plan_run_placement,
    spec_port_free,
)
from flows.estimate import RunEstimate, predicted_against_actual
from flows.plan import Stage, plan, searches_capacity
from flows.power import check_decision_power
from flows.service import host_limit
from flows.settings import Settings
from flows.spec import Spec, engine_api_key, load_spec
from flows.tracking import Tracker
from gates.accuracy import PowerPlan, plan_power
from gates.comparability import (
    Comparability,
    SetSettings,
    chat_template_hash,
    generation_settings,
    profile_hash,
    tokenizer_hash,
)
from gates.decide import decide
from gates.divergence import divergence_checks, perplexity_checks
from gates.latency import wants_more_rounds
from gates.policy import GatePolicy, load_policy, precision_class, save_run_policy
from gates.record import RunManifest, SetTiming, StageRecord, StageTimings
from gates.report import write_report
from gates.verdict import Verdict
from gates.whatif import workload_from_profile
from infra.checkpoint import (
    check_checkpoint,
    check_has_chat_template,
    check_same_chat_template,
    check_same_tokenizer,
    model_shape,
)
from infra.cores import CorePlan, plan_for
from infra.cpu_support import check_cpu_servable, cpu_flags
from infra.engine import EngineFacts, engine_class
from infra.errors import EngineError, GpuBusyError, MeasurementError, PortInUseError, SpecError
from infra.progress import progress
from infra.secrets import engine_key
from infra.vllm_engine import STARTED
from load.paired import Server, run_paired_load
from load.profile import LoadProfile, load_profile
from load.prompts import LoadPrompts, bind, describe, prepare, sized, source_digest
from load.results import LoadResult, PairedLoad
from load.runner import run_load


class Prepared:
    """Everything checked before any engine starts. `engine_host`: checked where the engines
    will run; elsewhere (a submission from a control host) a CUDA spec's placement is planned
    only when the GPUs are known (nvidia-smi, or the spec's gpu_memory_gib)."""

    def __init__(self, spec_path: Path, run_checks: bool = False,
                 engine_host: bool = True) -> None:
        """`run_checks`: also import and run a user eval set's own row checker (a run, which
        imports its code to score anyway); without it the set's code is only read."""
        self.spec_path = spec_path
        self.spec: Spec = load_spec(spec_path)
        self.api_key = engine_api_key(self.spec.engine)  # its clients send it; never stored
        self.stages: list[Stage] = plan(self.spec)
        self.pools: dict[str, int] = validate_sets(self.spec.evalsets, run_checks)
        check_chat_template(self.spec.evalsets, self.spec.chat_template)
        for stage in self.stages:
            if stage.structured_output:
                check_schema_items(stage.name, self.spec.evalsets)
        engine = self.spec.engine
        if engine.kind == "vllm":
            fit_to_context(self.spec.evalsets, engine.max_model_len)  # no bucket fits: fail now
            for checkpoint in dict.fromkeys(stage.checkpoint for stage in self.stages):
                check_checkpoint(checkpoint)  # headers and tokenizer: a broken file fails now
            check_prompts_fit(self.spec.evalsets, engine.max_model_len,
                              self.spec.baseline.checkpoint / "tokenizer.json")
            if engine.device == "cpu":
                flags = cpu_flags()
                for stage in self.stages:
                    axes = stage.axes
                    check_cpu_servable(stage.name, axes.weights, axes.activations, axes.kv_cache,
                                       axes.emulated, flags)
        for stage in self.stages[1:]:  # as the chat template: found now, not after both ran
            check_same_tokenizer(stage.name, stage.checkpoint, self.spec.baseline.checkpoint)
        if self.spec.chat_template:  # the comparability gate would find it after both stages ran
            check_has_chat_template(self.spec.baseline.checkpoint)  # each stage must match it
            for stage in self.stages[1:]:
                check_same_chat_template(stage.name, stage.checkpoint, self.spec.baseline.checkpoint)
        base = spec_path.resolve().parent
        profile = self.spec.load_profile
        if profile.endswith((".yaml", ".yml")) and not Path(profile).is_absolute():
            profile = str(base / profile)
        self.profile: LoadProfile = load_profile(profile)
        self.profile.check_fits(getattr(engine, "max_model_len", None), profile)
        # Where each CUDA engine goes, and that they fit, before any starts (None off CUDA).
        self.placement = plan_run_placement(self.spec, self.stages, kv_tokens_needed(
            self.profile, getattr(engine, "max_model_len", None)), required=engine_host)
        # Replayed load prompts are read and tokenized now: a bad prompt file fails before any engine.
        self.load_prompts: LoadPrompts | None = prepare(self.profile, self.spec.baseline.checkpoint)
        self.policy: GatePolicy = load_policy(self.spec.gate_policy, base)
        self.policy.check_min_items(self.pools, self.spec.gate_policy)
        self.power = check_power(self.spec, self.stages, self.pools, self.policy)
        self.decision_power = check_decision_power(self.spec, self.stages, self.pools, self.policy)


def check_power(spec: Spec, stages: list[Stage], pools: dict[str, int],
                policy: GatePolicy) -> list[PowerPlan]:
    """Refuse a spec whose sets cannot give the pooled accuracy test the policy's power."""
    sizes = {s.name: s.first_look(pools[s.name]) for s in spec.evalsets}
    classes = sorted({precision_class(s.axes.model_dump(exclude={"emulated"}))
                      for s in stages if s.parent is not None})
    plans = [plan_power(sizes, pools, precision, policy) for precision in classes]
    for power in plans:
        if power.power < policy.quality.power:
            hint = (f"use at least: {', '.join(f'{n} limit {k}' for n, k in power.needed.items())}"
                    if power.needed else "the sets do not hold enough items: add items, or widen "
                    "the margin in the gate policy")
            raise SpecError("eval sets too small for the accuracy gate: "
                            f"{power.describe(policy.quality.power)}; {hint}")
    return plans


# Prints are not logged here: dill (under datasets' fingerprints) captures stdout to read a
# disassembly, which print-logging would spill into the run log. Progress goes to the log itself.
@task(name="quality", cache_policy=NO_CACHE, log_prints=False)
def measure_quality(
    facts: EngineFacts, stage: Stage, spec: Spec, folder: Path, settings: Settings,
    prepared: Prepared | None = None, clock: dict[str, float] | None = None,
    kept: KeptEngines | None = None,
) -> QualityResult:
    # Divergence and perplexity pair this stage's corpus logprobs with the baseline's and the
    # parent's, stored beside it.
    baseline = None if stage.parent is None else folder.parent / "baseline" / "quality"
    parent = None if stage.parent is None else folder.parent / stage.parent / "quality"
    quality = run_quality(
        facts.base_url, facts.model, spec.evalsets, folder / "quality",
        tokenizer_dir=stage.checkpoint, apply_chat_template=spec.chat_template,
        num_concurrent=settings.num_concurrent, max_model_len=facts.max_model_len,
        baseline_dir=baseline, parent_dir=parent, structured_output=stage.structured_output,
    )
    if stage.parent is None or prepared is None:
        return quality
    decided = failed_for_good(stage, quality, folder.parent, prepared)
    if decided:
        progress.line(f"stage {stage.name}: already fails {', '.join(decided)}, which more items "
                      "cannot change: no adaptive looks")
        return quality
    # Inconclusive accuracy is not a dead end: score more items while the set has them.
    with timed(clock if clock is not None else {}, "more_items"):
        parents = [s for s in prepared.stages if s.name == stage.parent]
        return grow_until_decided(stage, quality, facts, spec, prepared.stages[0], folder.parent,
                                  prepared.policy, prepared.pools, settings.num_concurrent, kept,
                                  parents[0] if parents else None, prepared.placement)


def failed_for_good(stage: Stage, quality: QualityResult, results_dir: Path,
                    prepared: Prepared) -> list[str]:
    """Rules the stage already fails outright (not inconclusive) on what more eval items cannot
    change (divergence and perplexity are measured on the scoring corpus): its verdict is a
    rollback whatever the accuracy says, so looking again would only spend engine time."""
    parent = StageRecord.read(results_dir / stage.parent)
    baseline = StageRecord.read(results_dir / prepared.stages[0].name)
    mine = StageRecord(name=stage.name, kind=stage.kind, parent=stage.parent, quality=quality,
                       axes=stage.axes.model_dump(exclude={"emulated"}))
    checks = (divergence_checks(mine, prepared.policy)
              + perplexity_checks(mine, parent, baseline, prepared.policy))
    return [c.rule for c in checks if c.applicable and not c.passed and c.status == "fail"]


@contextlib.contextmanager
def timed(clock: dict[str, float], phase: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        clock[phase] = clock.get(phase, 0.0) + time.monotonic() - started


def stage_timings(record: StageRecord, clock: dict[str, float], wall_s: float) -> StageTimings:
    """Where the stage's wall time went, from what its results and `clock` hold."""
    own = record.facts.startup_s if record.facts else None
    beside = clock.get("reference_startup")  # the reference engine raced in the load rounds
    timings = StageTimings(wall_s=round(wall_s, 2),
                           startup_s=None if own is None else round(own + (beside or 0.0), 2),
                           more_items_s=_rounded(clock.get("more_items")),
                           load_s=_rounded(clock.get("load")))
    if record.quality is not None:
        timings.scoring_s = record.quality.scoring_s
        for name, task in record.quality.tasks.items():
            timings.sets[name] = SetTiming(
                items=len(task.items), seconds=task.seconds,
                output_tokens=sum(item.output_tokens or 0 for item in task.items))
    if record.load is not None:
        timings.load_levels_s = {level: summary.duration_s
                                 for level, summary in record.load.summaries.items()}
        timings.capacity_s = record.load.capacity_s
    return timings


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


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


@task(name="load", cache_policy=NO_CACHE)
def measure_load(facts: EngineFacts, profile: LoadProfile, folder: Path,
                 cores: CorePlan | None = None, request_body: dict | None = None) -> LoadResult:
    return run_load(facts.base_url, facts.model, profile, folder / "load", cores=cores,
                    request_body=request_body)


@task(name="paired load", cache_policy=NO_CACHE)
def measure_paired_load(
    facts: EngineFacts, reference_facts: EngineFacts, reference: Stage, profile: LoadProfile,
    folder: Path, cores: CorePlan | None = None, request_body: dict | None = None,
    salt: str = "", policy: GatePolicy | None = None,
) -> tuple[LoadResult, PairedLoad]:
    # Only the stage's side adds its request fields: the reference is asked as it always is.
    # A required latency rule that the rounds leave unresolved gets more rounds (its budget).
    return run_paired_load(
        Server(facts.base_url, facts.model, request_body, local=facts.pid is not None),
        Server(reference_facts.base_url, reference_facts.model,
               local=reference_facts.pid is not None),
        reference.name, profile, folder / "load", reference_command=reference_facts.command_line(),
        cores=cores, salt=salt,
        more_rounds=None if policy is None else lambda paired, level: wants_more_rounds(
            paired, level, policy),
    )


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
    engine = prepared.spec.engine
    if engine.kind == "external":
        urls = [engine.stage_urls.get(name, engine.url) for name in (stage.name, reference.name)]
        if urls[0] == urls[1]:
            return None
    return reference


def run_stage(stage: Stage, prepared: Prepared, folder: Path, settings: Settings,
              reused: set[str], kept: KeptEngines | None = None, keep: bool = False) -> StageRecord:
    """Start the engine, measure, stop; a failed measurement is kept as the stage's error.

    `reused`: stages restored from the cache in this run (their engines are not up to race).
    `keep`: a stage measured without error leaves its engine serving in `kept` for later stages.
    """
    from flows.served import check_served

    logger = get_run_logger()
    started, clock = time.monotonic(), {}
    record = StageRecord(
        name=stage.name, kind=stage.kind, parent=stage.parent,
        axes=stage.axes.model_dump(exclude={"emulated"}), emulated=stage.axes.emulated,
        changed=stage.changed, fingerprint=stage.fingerprint(), shape=model_shape(stage.checkpoint),
        request_options=stage.request_options or None,
    )
    spec = prepared.spec
    engine = engine_class(spec.engine.kind)(
        spec_port_free(spec, kept, prepared.placement), stage.checkpoint, stage.engine_flags,
        folder / "engine.log", stage.name
    )
    logger.info("stage %s: starting engine (%s)", stage.name, stage.axes.describe(stage.kind))
    try:
        with contextlib.ExitStack() as own:
            facts = own.enter_context(engine)
            record.facts = facts
            logger.info("stage %s: %s", stage.name, facts.ready_line())
            # What the engine says it serves must be what the axes say, before any measuring.
            check_served(stage, facts, spec.engine, folder / "engine.log")
            record.quality = measure_quality(facts, stage, spec, folder, settings, prepared,
                                             clock, kept)
            if stage.axes.emulated:
                # Dequantized weights served as bf16: their speed is not the format's. Quality
                # measured; speed predicted for the target GPU (gates/whatif), never measured.
                logger.info("stage %s: emulated, so no load (speed is predicted)", stage.name)
            else:
                measure_speed(stage, prepared, facts, folder, record, reused, clock, kept)
            if keep and kept is not None:
                kept.hold(stage.name, engine, facts, own.pop_all())
    except MeasurementError as err:
        record.error = str(err)
        if record.facts is not None and getattr(engine, "alive", lambda: True)() is False:
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


def not_measured(stage: Stage, parent: StageRecord) -> StageRecord:
    return StageRecord(
        name=stage.name, kind=stage.kind, parent=stage.parent,
        axes=stage.axes.model_dump(exclude={"emulated"}), emulated=stage.axes.emulated,
        changed=stage.changed, fingerprint=stage.fingerprint(), shape=model_shape(stage.checkpoint),
        request_options=stage.request_options or None,
        error=f"not measured: its parent {parent.name} did not finish ({parent.error})"[:2000],
    )


@contextlib.contextmanager
def host_slot() -> Iterator[None]:
    """Hold this host's slot while engines run (a no-op where the limit was not created, as in
    a one-shot `quantgate run` on Prefect's ephemeral server: asked first, so that Prefect's
    "Concurrency limits ... do not exist" warning, which a user cannot act on, is not printed)."""
    from prefect.client.orchestration import get_client
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectNotFound

    try:
        with get_client(sync_client=True) as client:
            client.read_global_concurrency_limit_by_name(host_limit())
    except ObjectNotFound:
        yield
        return
    with concurrency(host_limit(), occupy=1, strict=False, lease_duration=600):
        yield


def measure_stages(prepared: Prepared, results_dir: Path, settings: Settings, no_cache: bool,
                   manifest: RunManifest, tracker: Tracker) -> list[StageRecord]:
    """Each stage, from the cache when it was measured before, else served and measured."""
    spec = prepared.spec
    cache = StageCache(settings.stage_cache_dir)
    parts = stage_keys(prepared.stages, spec, prepared.profile.model_dump(mode="json"),
                       prepared.policy.model_dump(mode="json"))
    keys = {name: digest(p) for name, p in parts.items()}
    records: dict[str, StageRecord] = {}
    # The stage the verdict judges as the candidate (gates.decide): the last one not a control.
    candidate = next((s for s in reversed(prepared.stages[1:]) if s.kind != "control"), None)
    reused: set[str] = set()
    keep_until = engines_to_keep(prepared)
    cached = set() if no_cache else {s.name for s in prepared.stages
                                     if s.kind != "control" and cache.lookup(keys[s.name])}
    run_estimate = RunEstimate(prepared, settings.stage_cache_dir, cached,
                               "avx512f" in cpu_flags())
    _say(run_estimate.before())
    with KeptEngines() as kept:
        for index, stage in enumerate(prepared.stages):
            started = time.monotonic()
            record = measure_one(stage, prepared, results_dir, settings, no_cache, manifest,
                                 tracker, (cache, parts, keys), records, reused, kept,
                                 keep=stage.name in keep_until)
            for name in kept.names() - {n for n, last in keep_until.items() if last > index}:
                kept.release(name)  # no later stage races against it or scores more items on it
            records[stage.name] = record
            first = prepared.stages[0].name
            if stage.name != first and (results_dir / first / "stage.json").exists():
                records[first] = StageRecord.read(results_dir / first)  # grown by adaptive looks
            progress.line(stage_summary(record, list(records.values()), prepared.policy,
                                        time.monotonic() - started, final=stage is candidate))
            _say(run_estimate.after(index, record))
    manifest.timings |= run_estimate.timings()
    baseline = prepared.stages[0].name
    if records[baseline].error is None:  # later stages may have scored more baseline items
        cache.store(keys[baseline], parts[baseline], results_dir / baseline)
    manifest.cache_keys = keys
    manifest.save(results_dir)
    return list(records.values())


def _say(line: str | None) -> None:
    """A line in the Prefect run log, which also prints it (on a terminal, in CI's log)."""
    if line:
        progress.line(line)


def engines_to_keep(prepared: Prepared) -> dict[str, int]:
    """Stage name -> index of the last stage that may use its engine: the baseline's (adaptive
    looks score more of its items, timed stages race it) and each stage a later one is timed
    against. vllm-cpu only: on a GPU a third engine beside two may not fit in memory."""
    engine, stages = prepared.spec.engine, prepared.stages
    if engine.kind != "vllm" or engine.device != "cpu" or len(stages) < 2:
        return {}
    keep = {stages[0].name: len(stages) - 1}
    for index, stage in enumerate(stages):
        reference = timed_against(stage, prepared)
        if reference is not None:
            keep[reference.name] = max(keep.get(reference.name, 0), index)
    return keep


def measure_one(stage: Stage, prepared: Prepared, results_dir: Path, settings: Settings,
                no_cache: bool, manifest: RunManifest, tracker: Tracker,
                cached: tuple[StageCache, dict, dict[str, str]], records: dict[str, StageRecord],
                reused: set[str], kept: KeptEngines, keep: bool) -> StageRecord:
    """One stage: not measured (its parent failed), from the cache, or served and measured (its
    engine left serving in `kept` when `keep`)."""
    logger = get_run_logger()
    cache, parts, keys = cached
    folder = results_dir / stage.name
    manifest.stages.append(stage.name)
    manifest.save(results_dir)
    parent = records.get(stage.parent) if stage.parent else None
    with tracker.stage_run(prepared.spec.candidate, stage.name, stage.kind):
        if parent is not None and parent.error:
            record = not_measured(stage, parent)
            record.save(folder)
        elif (stage.kind != "control" and not no_cache
              and cache.restore(keys[stage.name], folder)):
            reused.add(stage.name)
            manifest.reused[stage.name] = keys[stage.name]
            logger.info("stage %s: measured before, taken from the cache (%s)", stage.name,
                        keys[stage.name][:12])
            record = StageRecord.read(folder)
        else:
            try:
                record = measure_stage(stage, prepared, results_dir, settings, reused, manifest,
                                       kept, keep)
            except BaseException:
                if (folder / "stage.json").exists():  # what it got before it broke
                    tracker.log_stage(StageRecord.read(folder), folder)
                raise
            record.cache_key = keys[stage.name]
            record.save(folder)
            if record.error is None and stage.kind != "control":
                cache.store(keys[stage.name], parts[stage.name], folder)
        tracker.log_stage(record, folder, cached=stage.name in reused)
    return record


def stage_summary(record: StageRecord, so_far: list[StageRecord], policy: GatePolicy,
                  seconds: float, final: bool = True) -> str:
    """One line per finished stage: its key quality numbers, TTFT/TPOT at low load, and the
    rules it already fails against what is measured so far (a stage before the `final` one is
    not held to the candidate's own rule: servable)."""
    parts = [f"stage {record.name} ({record.kind}) done in {seconds:.0f} s"]
    if record.error:
        return f"{parts[0]}: FAILED: {record.error.splitlines()[0][:200]}"
    if record.quality is not None:
        parts.append(", ".join(f"{name} {task.value:.2f} ({len(task.items)})"
                               for name, task in record.quality.tasks.items()))
        if record.quality.divergence is not None:
            parts.append(f"KL {record.quality.divergence.mean_kl:.4f}")
    low = record.load.summaries.get("low") if record.load is not None else None
    if low is not None and low.ttft_p50_ms is not None and low.tpot_p50_ms is not None:
        parts.append(f"TTFT {low.ttft_p50_ms:.0f} ms, TPOT {low.tpot_p50_ms:.1f} ms (low load)")
    if record.parent is not None:
        try:
            verdict = decide("so far", so_far, policy)
            mine = next((s for s in verdict.stages if s.stage == record.name), None)
            failed = [check.rule for check in mine.failures
                      if final or check.rule != "servable"] if mine else []
            parts.append(f"failing: {', '.join(failed)}" if failed else "no rule failed yet")
        except Exception as err:  # noqa: BLE001 - a summary line must not end the run
            parts.append(f"rules not judged yet ({type(err).__name__})")
    return "; ".join(parts)


def measure_stage(stage: Stage, prepared: Prepared, results_dir: Path, settings: Settings,
                  reused: set[str], manifest: RunManifest, kept: KeptEngines | None = None,
                  keep: bool = False) -> StageRecord:
    """Serve and measure one stage; the engines it started go into the manifest, also when
    the stage raises (a baseline that cannot start)."""
    before = len(STARTED)
    folder = results_dir / stage.name
    try:
        record = run_stage(stage, prepared, folder, settings, reused, kept, keep)
    finally:
        manifest.engine_starts += [f"{served} ({log.relative_to(results_dir)})"
                                   for served, log in STARTED[before:]
                                   if log.is_relative_to(results_dir)]
        manifest.save(results_dir)
    record.measured_in = results_dir.name
    record.measured_at = utc_now()
    return record


_CHECKED: dict[str, Prepared] = {}


def checked(spec_path: Path) -> Prepared:
    """Check a spec before Prefect starts; the flow then reuses it instead of checking again."""
    prepared = Prepared(spec_path, run_checks=True)
    _CHECKED[str(spec_path.resolve())] = prepared
    return prepared


@flow(name="acceptance", log_prints=True)
def acceptance(spec_path: str, no_cache: bool = False, registry_version: str | None = None) -> Verdict:
    """Baseline, then each stage against its parent; returns the verdict (also on disk).

    Parameters are plain values (a deployment queues them): the spec's path, whether to measure
    every stage again, and the `model@version` of the registry candidate this run judges.
    """
    settings = Settings()
    path = Path(spec_path)
    prepared = _CHECKED.pop(str(path.resolve()), None) or Prepared(path, run_checks=True)
    spec = prepared.spec
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results_dir = (settings.results_dir / f"{spec.candidate}-{stamp}-{uuid.uuid4().hex[:6]}"
                   ).resolve()
    manifest = RunManifest(candidate=spec.candidate, stages=[], spec_path=str(spec_path),
                           registry_version=registry_version,
                           placement=prepared.placement.model_dump() if prepared.placement else None)
    tracker = Tracker(settings.mlflow_tracking_uri, settings.mlflow_experiment)
    params = {"spec": str(spec_path), "results_dir": str(results_dir),
              "stages": " > ".join(s.name for s in prepared.stages),
              "evalsets": ",".join(e.name for e in spec.evalsets),
              "load_profile": spec.load_profile, "gate_policy": spec.gate_policy,
              "no_cache": str(no_cache), "registry_version": str(registry_version)}
    clock: dict[str, float] = {}
    run_started = time.monotonic()
    with tracker.candidate_run(spec.candidate, params, flow_run_tags()):
        if registry_version:
            tag_registry_version(settings, registry_version, "running", results_dir.name)
        with host_slot(), engine_key(prepared.api_key), timed(clock, "stages"):
            manifest.host_slot = [utc_now()]
            records = measure_stages(prepared, results_dir, settings, no_cache, manifest, tracker)
            manifest.host_slot.append(utc_now())
            manifest.save(results_dir)
        save_run_policy(prepared.policy, results_dir)  # `quantgate gate` re-judges by this one
        with timed(clock, "gating"):
            # As stored: later stages may have grown the baseline's items (adaptive sample size).
            records = [StageRecord.read(results_dir / record.name) for record in records]
            verdict = decide(spec.candidate, records, prepared.policy)
            verdict_path = verdict.save(results_dir / "verdict.json")
        report_dir = (settings.reports_dir / results_dir.name).resolve()
        with timed(clock, "reporting"):
            report = write_report(
                verdict, records, report_dir, signer=settings.signer,
                workload=workload_from_profile(sized(prepared.profile, prepared.load_prompts)),
                workload_source=f"load profile {spec.load_profile}",
                placement=prepared.placement.describe() if prepared.placement else ())
            verdict.save(report_dir / "verdict.json")
        clock["wall"] = time.monotonic() - run_started
        manifest.timings |= {phase: round(seconds, 2) for phase, seconds in clock.items()}
        manifest.save(results_dir)
        _say(predicted_against_actual(manifest.timings, clock["wall"]))
        tracker.log_verdict(verdict, verdict_path, report_dir)
        if registry_version:
            record_registry_verdict(settings, registry_version, verdict, report["html"],
                                    tracker.parent_run_id)
    print(f"verdict: {verdict.decision} -> {verdict_path}; report: {report['html']}")
    return verdict


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def tag_registry_version(settings: Settings, registry_version: str, status: str,
                         run: str) -> None:
    import mlflow

    model, _, version = registry_version.rpartition("@")
    client = mlflow.MlflowClient(settings.mlflow_tracking_uri)
    client.set_model_version_tag(model, version, "quantgate.status", status)
    client.set_model_version_tag(model, version, "quantgate.results", run)


def flow_run_tags() -> dict[str, str]:
    from prefect.runtime import flow_run

    return {"prefect.flow_run_id": str(flow_run.id), "prefect.flow_run_name": str(flow_run.name)}


def record_registry_verdict(settings: Settings, registry_version: str, verdict: Verdict,
                            report: Path, run_id: str | None) -> None:
    """The A/B switch: on go the version becomes `champion` (the old one `previous`)."""
    import mlflow

    from flows.registry import record_verdict

    model, _, version = registry_version.rpartition("@")
    client = mlflow.MlflowClient(settings.mlflow_tracking_uri)
    record_verdict(client, model, version, verdict.decision, verdict.reasons, str(report),
                   verdict.rollback_command, run_id)
