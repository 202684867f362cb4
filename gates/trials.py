"""Simulated acceptance runs: records shaped like the real sets through the adaptive looks and decide().

One trial draws a baseline and a stage or chain (gates.simulate), grows the stage's sets exactly as
the flow does (`gates.accuracy.next_look`: by prefix or by group, up to the policy's looks, each
look recorded) and judges it with `decide()`. The decision benchmark and validate's power check
both run on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from gates import simulate
from gates.accuracy import next_look, reach_of
from gates.decide import decide
from gates.latency import wants_more_rounds
from gates.policy import GatePolicy, precision_class
from gates.record import StageRecord
from gates.simulate import DEMO_SETS, SetShape, Step
from gates.verdict import Verdict
from infra.engine import EngineFacts
from load.results import LoadResult, LoadSample, LoadSummary, PairedLoad, PairedRound

UNQUANTIZED = {"weights": "none", "activations": "none", "kv_cache": "auto"}
W8A8 = {"weights": "int8/channel", "activations": "int8/token/dynamic", "kv_cache": "auto"}
W8A8_KV = W8A8 | {"kv_cache": "fp8_e4m3"}


@dataclass
class Scenario:
    """One row: what is true of the stage(s), and what a correct verdict is."""

    label: str
    steps: list[Step] = field(default_factory=lambda: [Step()])
    expect: str = "go"  # "go" (P(go) >= 95 %), "go80" (>= 80 %), "rollback" (<= 5 %), "never"
    # (0 %), or "either"
    flips: float = 0.15  # background share of items flipping both ways, per step
    sets: tuple[SetShape, ...] = DEMO_SETS
    kv: bool = False  # the stage changes the KV cache (judged per group)
    corpus_tokens: int = 26_000  # the demo's scoring corpus (about 450 blocks)
    drift: float = 0.0  # run-to-run latency drift (sigma of a log factor per round)
    request_errors: float = 0.0
    latency_required: bool = False
    axes: dict[str, str] | None = None  # the stage's served axes (default W8A8, + fp8 KV if kv)

    @property
    def near_target(self) -> bool:
        return self.expect in ("go", "rollback")


def _samples(rng: np.random.Generator, n: int, tpot: float, errors: float) -> list[LoadSample]:
    out = []
    for i in range(n):
        if rng.random() < errors:
            out.append(LoadSample(start_s=float(i), error="HTTP 500"))
            continue
        per_token = tpot * float(rng.lognormal(0, 0.10))
        first = 80 * float(rng.lognormal(0, 0.10))
        out.append(LoadSample(start_s=float(i), ttft_ms=first, e2e_ms=first + 31 * per_token,
                              output_tokens=32))
    return out


def _load(rng: np.random.Generator, scenario: Scenario, reference: str | None,
          increase: float, policy: GatePolicy) -> tuple[LoadResult, PairedLoad | None]:
    """Plain levels for the tables, and interleaved rounds against the reference when timed.

    Drift multiplies a whole round (both engines share the box and the moment), plus a small
    independent part per side; that is what interleaving buys. A required latency rule that the
    rounds leave unresolved gets more rounds, as the flow runs them (gates.latency)."""
    summaries, samples = {}, {}
    paired = PairedLoad(reference=reference or "", requests_per_round=6)
    for level, users in (("low", 1), ("high", 4)):
        level_samples = _samples(rng, 12, 25.0 * (1 + increase), scenario.request_errors)
        errors = sum(s.error is not None for s in level_samples)
        summaries[level] = LoadSummary(level=level, users=users, requests=12, errors=errors,
                                       error_rate=errors / 12, duration_s=30, requests_per_s=0.4,
                                       output_tokens_per_s=10, ttft_p50_ms=80,
                                       tpot_p50_ms=25 * (1 + increase))
        samples[level] = level_samples
        paired.rounds[level] = []
        index = 0
        while index < 3 or wants_more_rounds(paired, level, policy):
            tpot = 25.0 * float(rng.lognormal(0, scenario.drift))
            paired.rounds[level].append(PairedRound(
                index=index, first="reference" if index % 2 == 0 else "stage",
                reference=_samples(rng, 6, tpot * float(rng.lognormal(0, 0.03)),
                                   scenario.request_errors),
                stage=_samples(rng, 6, tpot * (1 + increase) * float(rng.lognormal(0, 0.03)),
                               scenario.request_errors)))
            index += 1
    load = LoadResult(summaries=summaries, samples=samples)
    return load, None if reference is None else paired


def _record(name: str, parent: str | None, axes: dict[str, str], quality, load: LoadResult,
            paired: PairedLoad | None) -> StageRecord:
    facts = EngineFacts(base_url="http://sim", model=name, command=["vllm", "--model", name],
                        kv_cache_tokens=100_000, weight_bytes=270_000_000)
    kind = "baseline" if parent is None else "kv_cache" if axes.get("kv_cache") != "auto" \
        else "activations"
    return StageRecord(name=name, kind=kind, parent=parent, axes=axes, facts=facts,
                       quality=quality, load=load, paired_load=paired, fingerprint=f"fp-{name}")


def scenario_policy(scenario: Scenario, policy: GatePolicy) -> GatePolicy:
    if not scenario.latency_required:
        return policy
    return policy.model_copy(update={"latency": policy.latency.model_copy(
        update={"required": True})})


def trial(scenario: Scenario, policy: GatePolicy, rng: np.random.Generator) -> Verdict:
    """One simulated run through the adaptive sample size and decide()."""
    policy = scenario_policy(scenario, policy)
    shapes = scenario.sets
    pools = {s.name: s.pool for s in shapes}
    group_pools = {s.name: {g: int(np.count_nonzero(s.group_labels == g)) for g in s.groups}
                   for s in shapes if len(s.groups) > 1}
    sizes = {s.name: s.first for s in shapes}
    reach = reach_of(sizes, pools, group_pools, policy)
    answers = {s.name: simulate.baseline_answers(rng, s) for s in shapes}
    lengths = {s.name: simulate.baseline_lengths(rng, s) for s in shapes}
    base_load, _ = _load(rng, scenario, None, 0.0, policy)
    items = {s.name: simulate.PoolItems(s, answers[s.name], lengths[s.name]) for s in shapes}
    records = [_record("baseline", None, UNQUANTIZED,
                       simulate.quality(shapes, items, pools, None), base_load, None)]
    axes = scenario.axes or (W8A8_KV if scenario.kv else W8A8)
    max_kl = policy.tolerance(precision_class(axes)).max_kl
    before = Step()
    for step_index, step in enumerate(scenario.steps):
        name, parent = f"s{step_index + 1}", records[-1].name
        answers = {s.name: simulate.stage_answers(rng, s, answers[s.name], step.drop,
                                                  before.drop, scenario.flips) for s in shapes}
        lengths = {s.name: simulate.stage_lengths(
            rng, lengths[s.name], _ratio(step.length, s.name) / _ratio(before.length, s.name))
            for s in shapes}
        step_increase = (1 + step.tpot_increase) / (1 + before.tpot_increase) - 1
        load, paired = _load(rng, scenario, parent, step_increase, policy)
        tokens = simulate.paired_tokens(rng, scenario.corpus_tokens, step.kl * max_kl, step.top1,
                                        0.006 * (step_index + 1))
        order = {s.name: np.arange(s.first) for s in shapes}
        items = {s.name: simulate.PoolItems(s, answers[s.name], lengths[s.name])
                 for s in shapes}
        quality = simulate.quality(shapes, items, sizes, tokens, order)
        quality.reach = reach
        parent_quality = records[-1].quality if step_index else None
        while quality.looks < policy.quality.max_looks:  # as flows.adaptive does
            look = next_look(quality, records[0].quality, precision_class(axes), policy, pools,
                             parent_quality, axes, group_pools=group_pools)
            if look is None:
                break
            looks = quality.looks
            earlier = quality.look_sizes + [{name: len(o) for name, o in order.items()}]
            order = {s.name: simulate.grown_order(s, order[s.name], look.sizes[s.name],
                                                  look.groups.get(s.name)) for s in shapes}
            quality = simulate.quality(shapes, items, sizes, tokens, order)
            quality.looks, quality.look_sizes, quality.reach = looks + 1, earlier, reach
        records.append(_record(name, parent, axes, quality, load, paired))
        before = step
    return decide("benchmark", records, policy)


def _ratio(table: dict[str, float], set_name: str) -> float:
    return table.get(set_name, table.get("*", 1.0))


def wilson(goes: int, trials: int) -> tuple[float, float]:
    ci = stats.binomtest(goes, trials).proportion_ci(0.95, method="wilson")
    return float(ci.low), float(ci.high)


def p_go(scenario: Scenario, policy: GatePolicy, trials: int, seed: int) -> tuple[float, dict]:
    rng = np.random.default_rng(seed)
    goes, blocking = 0, {}
    for _ in range(trials):
        verdict = trial(scenario, policy, rng)
        goes += verdict.decision == "go"
        # A rule counts once per run, however many stages of a chain it blocked.
        for rule in {check.rule for stage in verdict.stages for check in stage.failures}:
            blocking[rule] = blocking.get(rule, 0) + 1
    return goes / trials, blocking


