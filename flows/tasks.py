"""The Prefect tasks that measure a served stage: quality (with adaptive looks), load, paired load."""

from __future__ import annotations

import time
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from evalsets.results import QualityResult
from evalsets.runner import run_quality
from flows.adaptive import grow_until_decided, so_far
from flows.engines import KeptEngines
from flows.plan import BASELINE, Stage
from flows.preflight import Prepared
from flows.settings import Settings
from flows.spec import Spec
from flows.timing import timed
from gates.divergence import divergence_checks, perplexity_checks
from gates.latency import wants_more_rounds
from gates.policy import GatePolicy
from gates.record import StageRecord
from gates.token_pairs import pair_stage
from infra.cores import CorePlan
from infra.engine import EngineFacts
from infra.progress import progress
from load.paired import Server, run_paired_load
from load.profile import LoadProfile
from load.results import LoadResult, PairedLoad
from load.runner import run_load


# Prints are not logged here: dill (under datasets' fingerprints) captures stdout to read a
# disassembly, which print-logging would spill into the run log. Progress goes to the log itself.
@task(name="quality", cache_policy=NO_CACHE, log_prints=False)
def measure_quality(
    facts: EngineFacts, stage: Stage, spec: Spec, folder: Path, settings: Settings,
    prepared: Prepared | None = None, clock: dict[str, float] | None = None,
    kept: KeptEngines | None = None,
) -> QualityResult:
    # A later stage scores the baseline's corpus; measured, its logprobs are paired with the
    # baseline's and the parent's stored ones (divergence and paired perplexity).
    baseline = None if stage.parent is None else folder.parent / BASELINE / "quality"
    quality = run_quality(
        facts.base_url, facts.model, spec.evalsets, folder / "quality",
        tokenizer_dir=stage.checkpoint, apply_chat_template=spec.chat_template,
        num_concurrent=settings.num_concurrent, max_model_len=facts.max_model_len,
        kv_cache_tokens=facts.kv_cache_tokens,
        corpus_from=baseline, structured_output=stage.structured_output,
        corpus_tokens=prepared.policy.divergence.corpus_tokens if prepared else None,
    )
    if baseline is None:
        return quality
    paired(quality, folder / "quality", baseline, folder.parent / stage.parent / "quality")
    if prepared is None:
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


def paired(quality: QualityResult, stage_dir: Path, baseline_dir: Path, parent_dir: Path) -> None:
    """The stage's stored corpus logprobs paired with the baseline's and the parent's (a record
    of the stage's own, then: its quality.json saved again with the pairs)."""
    if quality.perplexity is None:  # no corpus scored: nothing to pair
        return
    started = time.monotonic()
    pair_stage(quality, stage_dir, baseline_dir, parent_dir)
    quality.scoring_s = round((quality.scoring_s or 0.0) + time.monotonic() - started, 2)
    quality.save(stage_dir)


def failed_for_good(stage: Stage, quality: QualityResult, results_dir: Path,
                    prepared: Prepared) -> list[str]:
    """Rules the stage already fails outright (not inconclusive) on what more eval items cannot
    change (divergence and perplexity are measured on the scoring corpus): its verdict is a
    rollback whatever the accuracy says, so looking again would only spend engine time."""
    parent = StageRecord.read(results_dir / stage.parent)
    baseline = StageRecord.read(results_dir / prepared.stages[0].name)
    mine = so_far(stage, quality)
    checks = (divergence_checks(mine, prepared.policy)
              + perplexity_checks(mine, parent, baseline, prepared.policy))
    return [c.rule for c in checks if c.applicable and not c.passed and c.status == "fail"]


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
