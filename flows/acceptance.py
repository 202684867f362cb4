"""The Prefect flow `acceptance`: baseline first, then one change at a time, then the gates.

The protocol, in order: the spec checked before any engine starts (flows/preflight.py); this
host's slot held (flows/host.py) while each stage is served, measured and stored
(flows/stage.py), the engines later stages race kept up (flows/references.py); then the verdict,
the report, and the registry's tags (flows/summary.py)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from prefect import flow

from flows.cache import StageCache, digest, stage_keys
from flows.diagnose import diagnose_failed
from flows.engines import KeptEngines
from flows.estimate import RunEstimate, predicted_against_actual
from flows.host import host_slot
from flows.preflight import Prepared, take_checked
from flows.references import engines_to_keep
from flows.repair import repair_stages
from flows.run_context import RunContext
from flows.run_inputs import keep_inputs
from flows.settings import Settings
from flows.stage import measure_one
from flows.summary import flow_run_tags, record_registry_verdict, stage_summary, tag_registry_version
from flows.timing import timed, utc_now
from flows.tracking import Tracker
from gates.decide import decide, repair_verdicts
from gates.diagnosis import Diagnosis
from gates.policy import save_run_policy
from gates.record import RunManifest, StageRecord
from gates.report import write_report
from gates.run_inputs import stored_prompts
from gates.verdict import Verdict
from gates.whatif import workload_from_profile
from infra.cpu_support import cpu_flags
from infra.progress import progress
from infra.secrets import engine_key
from load.prompts import sized


def measure_stages(prepared: Prepared, results_dir: Path, settings: Settings, no_cache: bool,
                   manifest: RunManifest, tracker: Tracker) -> list[StageRecord]:
    """Each stage, from the cache when it was measured before, else served and measured."""
    spec = prepared.spec
    cache = StageCache(settings.stage_cache_dir)
    parts = stage_keys(prepared.stages, spec, prepared.profile.model_dump(mode="json"),
                       prepared.policy.model_dump(mode="json"), settings.num_concurrent)
    keys = {name: digest(p) for name, p in parts.items()}
    # The stage the verdict judges as the candidate (gates.decide): the last one not a control.
    candidate = next((s for s in reversed(prepared.stages[1:]) if s.kind != "control"), None)
    keep_until = engines_to_keep(prepared)
    cached = set() if no_cache else {s.name for s in prepared.stages
                                     if s.kind != "control" and cache.lookup(keys[s.name])}
    on_rollback = ("repair" if settings.repair_on_rollback else
                   "diagnosis" if settings.diagnose_on_rollback else "")
    run_estimate = RunEstimate(prepared, settings.stage_cache_dir, cached,
                               None if spec.engine.on_gpu() else "avx512f" in cpu_flags(),
                               on_rollback)
    _say(run_estimate.before())
    with KeptEngines() as kept:
        run = RunContext(prepared, results_dir, settings, no_cache, manifest, tracker, cache,
                         parts, keys, kept, keep_until)
        records = run.records
        for index, stage in enumerate(prepared.stages):
            started = time.monotonic()
            record = measure_one(stage, run)
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


def on_rollback(prepared: Prepared, results_dir: Path, settings: Settings, no_cache: bool,
                manifest: RunManifest, tracker: Tracker, records: list[StageRecord],
                verdict: Verdict, clock: dict[str, float]
                ) -> tuple[list[StageRecord], Verdict, dict[str, Diagnosis]]:
    """Each failed stage diagnosed and, where asked, its repair built and measured (the host's
    slot held: the diagnosis uses every core the box gives this process, as an engine would);
    the verdict again, the candidate's decision unchanged, each repair's beside it; the
    diagnoses by stage, as stored."""
    diagnoses: dict[str, Diagnosis] = {}
    with host_slot(), engine_key(prepared.api_key):
        with timed(clock, "diagnosis"):
            threads = len(os.sched_getaffinity(0))
            _say(f"diagnosis: where each failed stage loses ({threads} threads, "
                 f"{settings.diagnose_max_tokens} corpus tokens per group)")
            for found in diagnose_failed(results_dir, verdict, records, prepared.policy,
                                         max_tokens=settings.diagnose_max_tokens,
                                         threads=threads):
                diagnoses[found.stage] = found
                chosen = (found.repair.name if found.repair else
                          "none under the target" if found.repairs else
                          f"not searched{': ' + found.repair_why if found.repair_why else ''}")
                _say(f"diagnosis of {found.stage}: {found.forwards} groups in "
                     f"{found.seconds:.0f} s; repair: {chosen}")
        if not settings.repair_on_rollback:
            return records, verdict, diagnoses
        with timed(clock, "repair"):
            records = repair_stages(prepared, results_dir, settings, no_cache, manifest, tracker,
                                    records, diagnoses)
    verdict = decide(prepared.spec.candidate, records, prepared.policy)
    verdict.repairs = repair_verdicts(prepared.spec.candidate, records, prepared.policy,
                                      diagnoses)
    return records, verdict, diagnoses


@flow(name="acceptance", log_prints=True)
def acceptance(spec_path: str, no_cache: bool = False, registry_version: str | None = None) -> Verdict:
    """Baseline, then each stage against its parent; returns the verdict (also on disk).

    Parameters are plain values (a deployment queues them): the spec's path, whether to measure
    every stage again, and the `model@version` of the registry candidate this run judges.
    """
    settings = Settings()
    path = Path(spec_path)
    prepared = take_checked(path)
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
        # What the run asks, kept before the first stage: `quantgate gate` reads it there.
        keep_inputs(results_dir, spec, sized(prepared.profile, prepared.load_prompts))
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
        diagnoses: dict[str, Diagnosis] = {}
        if verdict.decision == "rollback" and (settings.diagnose_on_rollback
                                               or settings.repair_on_rollback):
            records, verdict, diagnoses = on_rollback(
                prepared, results_dir, settings, no_cache, manifest, tracker, records, verdict,
                clock)
            verdict.save(verdict_path)
        report_dir = (settings.reports_dir / results_dir.name).resolve()
        with timed(clock, "reporting"):
            report = write_report(
                verdict, records, report_dir, signer=settings.signer,
                diagnoses=diagnoses,
                workload=workload_from_profile(sized(prepared.profile, prepared.load_prompts)),
                prompts=lambda name: stored_prompts(results_dir, name),  # as a re-gate shows them
                workload_source=f"load profile {spec.load_profile}",
                placement=prepared.placement)
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
