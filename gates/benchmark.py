"""Decision-quality benchmark: the project's own decide() over simulated records at demo sizes.

    python -m gates.benchmark [--trials 200] [--seed 0] [--policy PATH]

Each trial draws a baseline and a stage (or a three-stage chain) answering the demo's four sets
(math 60, business 40, code 20, long-context 40 items at the first look, with the pools the sets
hold, at the baseline accuracies the real demo measured), with background flips both ways and a
true accuracy drop; per-token divergence, perplexity, output lengths and interleaved latency
rounds that a good stage would show unless the row says otherwise. The stage then goes through
the adaptive sample size exactly as the flow does (`gates.accuracy.more_items`, up to the
policy's looks) and through `decide()`. The table prints P(go) per row.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evalsets.results import (
    Divergence,
    PairedTokens,
    QualityItem,
    QualityResult,
    TaskQuality,
)
from gates.accuracy import more_items
from gates.decide import decide
from gates.policy import GatePolicy, load_policy, precision_class
from gates.record import StageRecord
from gates.verdict import Verdict
from infra.engine import EngineFacts
from load.results import LoadResult, LoadSample, LoadSummary, PairedLoad, PairedRound

# The demo's sets: first-look items, pool, and the baseline accuracy measured on the real demo.
DEMO_SETS = {"math": (60, 1040, 0.217), "business": (40, 300, 0.325),
             "code": (20, 160, 0.85), "long_context": (40, 120, 0.775)}
UNQUANTIZED = {"weights": "none", "activations": "none", "kv_cache": "auto"}
W8A8 = {"weights": "int8/channel", "activations": "int8/token/dynamic", "kv_cache": "auto"}


@dataclass
class Scenario:
    """One row: what is true of the stage(s), and what a correct verdict is."""

    label: str
    drops: list[float]  # true accuracy drop per stage of the chain, cumulative vs the baseline
    flips: float = 0.05  # background share of items flipping both ways
    collapse: str | None = None  # a set where every right answer breaks at the first stage
    drift: float = 0.0  # run-to-run latency drift (sigma of a log factor per round)
    tpot_increase: list[float] = field(default_factory=list)  # true, per stage, cumulative
    request_errors: float = 0.0
    expect: str = "go"


def scenarios(policy: GatePolicy) -> list[Scenario]:
    twice = round(200 * policy.tolerance("8bit").accuracy_margin)
    rows = [Scenario(f"accuracy drop {d} pts{' (2x margin)' if d == twice else ''}, {f:.0%} flips",
                     [d / 100], flips=f,
                     expect="go" if d == 0 else "rollback" if d >= twice else "either")
            for f in (0.05, 0.15) for d in sorted({0, 2, 5, 10, twice, 20})]
    return rows + [
        Scenario("collapse: code 3/20 -> 0/20, rest unchanged", [0.0], collapse="code",
                 expect="rollback"),
        Scenario("A/A, latency drift sigma 0.15", [0.0], drift=0.15),
        Scenario("A/A, latency drift sigma 0.30", [0.0], drift=0.30),
        Scenario("A/A, 0.5 % request errors", [0.0], request_errors=0.005),
        Scenario("true +30 % TPOT, drift sigma 0.15", [0.0], drift=0.15, tpot_increase=[0.30],
                 expect="rollback"),
        Scenario("creep: -4 pts per step over 3 stages", [0.04, 0.08, 0.12], expect="rollback"),
        Scenario("creep: +15 % TPOT per step over 3 stages", [0.0, 0.0, 0.0],
                 tpot_increase=[0.15, 0.3225, 0.520875], expect="rollback"),
    ]


def _answers(rng: np.random.Generator, truth: dict[str, np.ndarray], drop: float, flips: float,
             collapse: str | None) -> dict[str, np.ndarray]:
    """A stage's answers: each set loses `drop` points on average with `flips` discordance."""
    out = {}
    for name, right in truth.items():
        accuracy = right.mean()
        p_break = min(1.0, (flips + drop) / (2 * accuracy)) if accuracy else 0.0
        p_fix = max(0.0, (flips - drop) / (2 * (1 - accuracy))) if accuracy < 1 else 0.0
        draw = rng.random(right.size)
        stage = np.where(right, draw >= p_break, draw < p_fix)
        if name == collapse:
            stage = np.zeros_like(right)
        out[name] = stage
    return out


def _quality(name: str, answers: dict[str, np.ndarray], sizes: dict[str, int],
             tokens: PairedTokens | None) -> QualityResult:
    tasks = {}
    for set_name, right in answers.items():
        items = [QualityItem(id=str(i), prompt_hash="h", response="", score=float(ok),
                             output_tokens=40, finish_reason="stop")
                 for i, ok in enumerate(right[:sizes[set_name]])]
        tasks[set_name] = TaskQuality(task=set_name, metric="acc", items=items,
                                      value=float(np.mean([i.score for i in items])))
    divergence = None if tokens is None else Divergence(tokens=tokens.tokens, mean_kl=0.002,
                                                        top1_agreement=0.98, top_k=20)
    return QualityResult(tasks=tasks, perplexity=10.0, divergence=divergence,
                         paired_tokens=tokens)


def _tokens(rng: np.random.Generator) -> PairedTokens:
    """A near-lossless stage's per-token series: 64 texts of 64 positions."""
    n = 64 * 64
    nll = rng.normal(0.002, 0.05, n)
    return PairedTokens.from_values(
        20, [(f"t{i}", 64) for i in range(64)], kl=rng.exponential(0.002, n),
        top1_agree=(rng.random(n) < 0.98).astype(int), nll_diff_vs_baseline=nll,
        nll_diff_vs_parent=nll)


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
          increase: float) -> tuple[LoadResult, PairedLoad | None]:
    """Plain levels for the tables, and interleaved rounds against the reference when timed.

    Drift multiplies a whole round (both engines share the box and the moment), plus a small
    independent part per side; that is what interleaving buys."""
    summaries, samples, rounds = {}, {}, {}
    for level, users in (("low", 1), ("high", 4)):
        level_samples = _samples(rng, 12, 25.0 * (1 + increase), scenario.request_errors)
        errors = sum(s.error is not None for s in level_samples)
        summaries[level] = LoadSummary(level=level, users=users, requests=12, errors=errors,
                                       error_rate=errors / 12, duration_s=30, requests_per_s=0.4,
                                       output_tokens_per_s=10, ttft_p50_ms=80,
                                       tpot_p50_ms=25 * (1 + increase))
        samples[level] = level_samples
        rounds[level] = []
        for index in range(3):
            shared = float(rng.lognormal(0, scenario.drift))
            tpot = 25.0 * shared
            rounds[level].append(PairedRound(
                index=index, first="reference" if index % 2 == 0 else "stage",
                reference=_samples(rng, 6, tpot * float(rng.lognormal(0, 0.03)),
                                   scenario.request_errors),
                stage=_samples(rng, 6, tpot * (1 + increase) * float(rng.lognormal(0, 0.03)),
                               scenario.request_errors)))
    load = LoadResult(summaries=summaries, samples=samples)
    paired = None if reference is None else PairedLoad(reference=reference, requests_per_round=6,
                                                       rounds=rounds)
    return load, paired


def _record(name: str, parent: str | None, axes: dict[str, str], quality: QualityResult,
            load: LoadResult, paired: PairedLoad | None) -> StageRecord:
    facts = EngineFacts(base_url="http://sim", model=name, command=["vllm", "--model", name],
                        kv_cache_tokens=100_000, weight_bytes=270_000_000)
    return StageRecord(name=name, kind="baseline" if parent is None else "activations",
                       parent=parent, axes=axes, facts=facts, quality=quality, load=load,
                       paired_load=paired, fingerprint=f"fp-{name}")


def trial(scenario: Scenario, policy: GatePolicy, rng: np.random.Generator) -> Verdict:
    """One simulated run through the adaptive sample size and decide()."""
    truth = {name: rng.random(pool) < accuracy for name, (_, pool, accuracy) in DEMO_SETS.items()}
    if scenario.collapse:  # the example: 3 of the first 20 right (15 %) at the baseline
        pool = DEMO_SETS[scenario.collapse][1]
        right = rng.random(pool) < 0.15
        right[:20] = False
        right[[2, 9, 15]] = True
        truth[scenario.collapse] = right
    pools = {name: pool for name, (_, pool, _) in DEMO_SETS.items()}
    sizes = {name: first for name, (first, _, _) in DEMO_SETS.items()}
    base_load, _ = _load(rng, scenario, None, 0.0)
    records = [_record("baseline", None, UNQUANTIZED,
                       _quality("baseline", truth, pools, None), base_load, None)]
    increases = scenario.tpot_increase or [0.0] * len(scenario.drops)
    previous_increase = 0.0
    for step, (drop, increase) in enumerate(zip(scenario.drops, increases, strict=True)):
        name, parent = f"s{step + 1}", records[-1].name
        answers = _answers(rng, truth, drop, scenario.flips,
                           scenario.collapse if step == 0 else None)
        step_increase = (1 + increase) / (1 + previous_increase) - 1
        previous_increase = increase
        load, paired = _load(rng, scenario, parent, step_increase)
        stage_sizes = dict(sizes)
        quality = _quality(name, answers, stage_sizes, _tokens(rng))
        precision = precision_class(W8A8)
        while quality.looks < policy.quality.max_looks:  # as flows.adaptive does
            grown = more_items(quality, records[0].quality, precision, policy, pools)
            if grown is None:
                break
            stage_sizes = grown
            looks = quality.looks
            quality = _quality(name, answers, stage_sizes, quality.paired_tokens)
            quality.looks = looks + 1
        records.append(_record(name, parent, W8A8, quality, load, paired))
    return decide("benchmark", records, policy)


def p_go(scenario: Scenario, policy: GatePolicy, trials: int, seed: int) -> tuple[float, dict]:
    rng = np.random.default_rng(seed)
    goes, blocking = 0, {}
    for _ in range(trials):
        verdict = trial(scenario, policy, rng)
        goes += verdict.decision == "go"
        for stage in verdict.stages:
            for check in stage.failures:
                blocking[check.rule] = blocking.get(check.rule, 0) + 1
    return goes / trials, blocking


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", default="default", help="Policy name or path.")
    parser.add_argument("--only", default=None, help="Rows whose label contains this text.")
    args = parser.parse_args(argv)
    policy = load_policy(args.policy, Path.cwd())
    print(f"decide() over {args.trials} simulated runs per row; demo sets "
          + ", ".join(f"{n} {first}/{pool} items" for n, (first, pool, _) in DEMO_SETS.items())
          + f"; up to {policy.quality.max_looks} looks")
    print(f"{'scenario':46} {'expected':>9} {'P(go)':>7}  blocking rules (share of runs)")
    for scenario in scenarios(policy):
        if args.only and args.only not in scenario.label:
            continue
        rate, blocking = p_go(scenario, policy, args.trials, args.seed)
        top = ", ".join(f"{rule} {count / args.trials:.0%}"
                        for rule, count in sorted(blocking.items(), key=lambda kv: -kv[1])[:3])
        print(f"{scenario.label:46} {scenario.expect:>9} {rate:7.1%}  {top}")


if __name__ == "__main__":
    main()
