"""The Prefect flow `acceptance`: baseline first, then one change at a time, then the gates."""

from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from evalsets.contracts import fit_to_context, validate_sets
from evalsets.results import QualityResult
from evalsets.runner import run_quality
from flows.adaptive import grow_until_decided
from flows.engines import REFERENCE_PORT_OFFSET, engine_beside
from flows.plan import Stage, plan
from flows.settings import Settings
from flows.spec import Spec, load_spec
from flows.tracking import Tracker
from gates.accuracy import PowerPlan, plan_power
from gates.decide import decide
from gates.policy import GatePolicy, load_policy, precision_class, save_run_policy
from gates.record import RunManifest, StageRecord
from gates.report import write_report
from gates.verdict import Verdict
from infra.cpu_support import check_cpu_servable, cpu_flags
from infra.engine import EngineFacts, engine_class
from infra.errors import EngineError, MeasurementError, SpecError
from load.paired import Server, run_paired_load
from load.profile import LoadProfile, load_profile
from load.results import LoadResult, PairedLoad
from load.runner import run_load


class Prepared:
    """Everything checked before any engine starts."""

    def __init__(self, spec_path: Path) -> None:
        self.spec_path = spec_path
        self.spec: Spec = load_spec(spec_path)
        self.stages: list[Stage] = plan(self.spec)
        self.pools: dict[str, int] = validate_sets(self.spec.evalsets)
        engine = self.spec.engine
        if engine.kind == "vllm":
            fit_to_context(self.spec.evalsets, engine.max_model_len)  # no bucket fits: fail now
            if engine.device == "cpu":
                flags = cpu_flags()
                for stage in self.stages:
                    axes = stage.axes
                    check_cpu_servable(stage.name, axes.weights, axes.activations, axes.kv_cache,
                                       axes.emulated, flags)
        base = spec_path.resolve().parent
        profile = self.spec.load_profile
        if profile.endswith((".yaml", ".yml")) and not Path(profile).is_absolute():
            profile = str(base / profile)
        self.profile: LoadProfile = load_profile(profile)
        self.policy: GatePolicy = load_policy(self.spec.gate_policy, base)
        self.power = check_power(self.spec, self.stages, self.pools, self.policy)


def check_power(spec: Spec, stages: list[Stage], pools: dict[str, int],
                policy: GatePolicy) -> list[PowerPlan]:
    """Refuse a spec whose sets cannot give the pooled accuracy test the policy's power."""
    sizes = {s.name: min(s.limit or pools[s.name], pools[s.name]) for s in spec.evalsets}
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


@task(name="quality", cache_policy=NO_CACHE)
def measure_quality(
    facts: EngineFacts, stage: Stage, spec: Spec, folder: Path, settings: Settings,
    prepared: Prepared | None = None,
) -> QualityResult:
    # Divergence and perplexity pair this stage's corpus logprobs with the baseline's and the
    # parent's, stored beside it.
    baseline = None if stage.parent is None else folder.parent / "baseline" / "quality"
    parent = None if stage.parent is None else folder.parent / stage.parent / "quality"
    quality = run_quality(
        facts.base_url, facts.model, spec.evalsets, folder / "quality",
        tokenizer_dir=stage.checkpoint, apply_chat_template=spec.chat_template,
        num_concurrent=settings.num_concurrent, max_model_len=facts.max_model_len,
        baseline_dir=baseline, parent_dir=parent,
    )
    if stage.parent is None or prepared is None:
        return quality
    # Inconclusive accuracy is not a dead end: score more items while the set has them.
    return grow_until_decided(stage, quality, facts, spec, prepared.stages[0], folder.parent,
                              prepared.policy, prepared.pools, settings.num_concurrent)


@task(name="load", cache_policy=NO_CACHE)
def measure_load(facts: EngineFacts, profile: LoadProfile, folder: Path) -> LoadResult:
    return run_load(facts.base_url, facts.model, profile, folder / "load")


@task(name="paired load", cache_policy=NO_CACHE)
def measure_paired_load(
    facts: EngineFacts, reference_facts: EngineFacts, reference: Stage, profile: LoadProfile,
    folder: Path,
) -> tuple[LoadResult, PairedLoad]:
    return run_paired_load(
        Server(facts.base_url, facts.model), Server(reference_facts.base_url, reference_facts.model),
        reference.name, profile, folder / "load", reference_command=reference_facts.command_line(),
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


def run_stage(stage: Stage, prepared: Prepared, folder: Path, settings: Settings) -> StageRecord:
    """Start the engine, measure, stop; a failed measurement is kept as the stage's error."""
    logger = get_run_logger()
    record = StageRecord(
        name=stage.name, kind=stage.kind, parent=stage.parent,
        axes=stage.axes.model_dump(exclude={"emulated"}), emulated=stage.axes.emulated,
        changed=stage.changed, fingerprint=stage.fingerprint(),
    )
    spec = prepared.spec
    engine = engine_class(spec.engine.kind)(
        spec.engine, stage.checkpoint, stage.engine_flags, folder / "engine.log", stage.name
    )
    logger.info("stage %s: starting engine (%s)", stage.name, stage.axes.describe())
    try:
        with engine as facts:
            record.facts = facts
            logger.info("stage %s: healthy in %ss, KV %s tokens", stage.name, facts.startup_s,
                        facts.kv_cache_tokens)
            record.quality = measure_quality(facts, stage, spec, folder, settings, prepared)
            reference = timed_against(stage, prepared)
            if reference is None:
                record.load = measure_load(facts, prepared.profile, folder)
            else:
                # Both engines up at once, loaded in alternating rounds: drift between runs hits
                # both sides of a round alike (load/README.md).
                logger.info("stage %s: starting %s beside it for interleaved timing", stage.name,
                            reference.name)
                with engine_beside(spec, reference, folder / "reference-engine.log",
                                   REFERENCE_PORT_OFFSET) as reference_facts:
                    record.load, record.paired_load = measure_paired_load(
                        facts, reference_facts, reference, prepared.profile, folder)
    except MeasurementError as err:
        record.error = str(err)
        logger.error("stage %s: %s", stage.name, err)
    except EngineError as err:
        record.error = str(err)
        if record.facts is None:  # never came up: nothing more to learn from later stages
            record.save(folder)
            raise
    record.save(folder)
    return record


@flow(name="acceptance", log_prints=True)
def acceptance(
    spec_path: str, settings: Settings | None = None, prepared: Prepared | None = None
) -> Verdict:
    """Baseline, then each stage against its parent; returns the verdict (also on disk).

    `prepared` is the spec already checked by the caller (the CLI checks before Prefect starts),
    so the Great Expectations contracts and CPU checks do not run twice.
    """
    settings = settings or Settings()
    prepared = prepared or Prepared(Path(spec_path))
    spec = prepared.spec
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results_dir = (settings.results_dir / f"{spec.candidate}-{stamp}").resolve()
    manifest = RunManifest(candidate=spec.candidate, stages=[], spec_path=str(spec_path))
    tracker = Tracker(settings.mlflow_tracking_uri, settings.mlflow_experiment)
    params = {"spec": str(spec_path), "results_dir": str(results_dir),
              "stages": " > ".join(s.name for s in prepared.stages),
              "evalsets": ",".join(e.name for e in spec.evalsets),
              "load_profile": spec.load_profile, "gate_policy": spec.gate_policy}
    with tracker.candidate_run(spec.candidate, params):
        records = []
        for stage in prepared.stages:
            folder = results_dir / stage.name
            manifest.stages.append(stage.name)
            manifest.save(results_dir)
            try:
                record = run_stage(stage, prepared, folder, settings)
            finally:
                if (folder / "stage.json").exists():
                    tracker.log_stage(spec.candidate, StageRecord.read(folder), folder)
            records.append(record)
        save_run_policy(prepared.policy, results_dir)  # `quantgate gate` re-judges by this one
        # As stored: later stages may have grown the baseline's items (adaptive sample size).
        records = [StageRecord.read(results_dir / record.name) for record in records]
        verdict = decide(spec.candidate, records, prepared.policy)
        verdict_path = verdict.save(results_dir / "verdict.json")
        report_dir = (settings.reports_dir / results_dir.name).resolve()
        report = write_report(verdict, records, report_dir, signer=settings.signer)
        verdict.save(report_dir / "verdict.json")
        tracker.log_verdict(verdict, verdict_path, report_dir)
    print(f"verdict: {verdict.decision} -> {verdict_path}; report: {report['html']}")
    return verdict
