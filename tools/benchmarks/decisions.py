"""Decision-quality benchmark: the project's own decide() over records shaped like the real sets.

    python -m tools.benchmarks.decisions [--trials 200] [--near-target-trials 1000] [--seed 0] [--only TEXT]

Each trial draws a baseline and a stage (or a chain) with `gates.simulate`: the demo's four sets
(math 60, business 40, code 20, long context 40 items at the first look, with their pools, the
long-context set in four length buckets, business in its three task groups), clusters, ceilings,
answer lengths cut at a budget, heavy-tailed per-token KL, interleaved latency rounds. The stage
then goes through the adaptive sample size exactly as the flow does (`gates.accuracy.next_look`, by
prefix or by group, up to the policy's looks) and through `decide()`. Each row prints P(go) with
its 95 % Wilson interval; a row whose target is a rate near 5 % or 95 % runs `--near-target-trials`
trials.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

from gates.policy import GatePolicy, load_policy
from gates.simulate import DEMO_SETS, SetShape, Step
from gates.trials import Scenario, p_go, trial, wilson
from infra.spread import forked_pool

__all__ = ["Scenario", "main", "p_go", "scenarios", "trial", "wilson"]


def _clustered(shapes: tuple[SetShape, ...], size: int, rho: float) -> tuple[SetShape, ...]:
    return tuple(replace(s, cluster_size=size, cluster_rho=rho) for s in shapes)


def _ceiling(shapes: tuple[SetShape, ...], name: str, accuracy: float) -> tuple[SetShape, ...]:
    return tuple(replace(s, accuracy={"": accuracy}) if s.name == name else s for s in shapes)


SINGLE_1000 = (SetShape("business", 1000, 1000, {"": 0.6}, tokens=90, budget=256),)
# A user's set at the floor: 50 right answers of 1,000, no set to pool with.
SINGLE_FLOOR = (SetShape("business", 1000, 1000, {"": 0.05}, tokens=90, budget=256),)
# A 1,000-item long-context set in the demo's four buckets (250 each), 200 at the first look.
LONG_1000 = (SetShape("long_context", 200, 1000, {"512": 0.95, "1k": 0.85, "2k": 0.75, "4k": 0.55},
                      tokens=12, budget=32),)


def scenarios(policy: GatePolicy) -> list[Scenario]:
    m = policy.tolerance("8bit").accuracy_margin
    cut_budget = tuple(replace(s, budget=int(s.tokens * 1.6)) for s in DEMO_SETS)
    heavy_cut = tuple(replace(s, budget=int(s.tokens * 1.15)) for s in DEMO_SETS)
    rows = [
        Scenario("A/A, 15 % flips"),
        Scenario("A/A, 10 % flips", flips=0.10),
        Scenario("A/A, 15 % flips, kv stage", kv=True),
        Scenario(f"pooled drop {m:.0%} (the margin)", [Step(drop={"*": m})], "rollback"),
        Scenario(f"pooled drop {2 * m:.0%} (2x margin)", [Step(drop={"*": 2 * m})], "never"),
        Scenario(f"code loses {m:.0%}, others gain 3 pts",
                 [Step(drop={"code": m, "*": -0.03})], "rollback"),
        Scenario(f"code loses {2 * m:.0%}, others gain 3 pts",
                 [Step(drop={"code": 2 * m, "*": -0.03})], "never"),
        Scenario(f"kv: only the 4k bucket loses {m:.0%}",
                 [Step(drop={"long_context.4k": m})], "rollback", kv=True),
        Scenario(f"kv: only the 4k bucket loses {2 * m:.0%}",
                 [Step(drop={"long_context.4k": 2 * m})], "never", kv=True),
        Scenario(f"kv: only the 4k bucket loses {4 * m:.0%}",
                 [Step(drop={"long_context.4k": 4 * m})], "never", kv=True),
        Scenario(f"kv: only the 512 bucket (95 %) loses {2 * m:.0%}",
                 [Step(drop={"long_context.512": 2 * m})], "never", kv=True),
        Scenario(f"kv: only the 1k bucket (85 %) loses {2 * m:.0%}",
                 [Step(drop={"long_context.1k": 2 * m})], "never", kv=True),
        Scenario("code at the ceiling (95 %), A/A", sets=_ceiling(DEMO_SETS, "code", 0.95),
                 flips=0.05),
        Scenario(f"code at the ceiling, 95 % -> {95 - 100 * m:.0f} %",
                 [Step(drop={"code": m})], "rollback", sets=_ceiling(DEMO_SETS, "code", 0.95),
                 flips=0.05),
        Scenario("business at the floor (8 %), A/A", sets=_ceiling(DEMO_SETS, "business", 0.08),
                 flips=0.03),
        Scenario("business at the floor (8 %), A/A, 15 % flips",
                 sets=_ceiling(DEMO_SETS, "business", 0.08)),
        Scenario(f"business at the floor (8 %) loses all {100 * m:.0f} pts",
                 [Step(drop={"business": m})], "rollback",
                 sets=_ceiling(DEMO_SETS, "business", 0.08), flips=0.03),
        Scenario("clusters of 5 near-duplicates, A/A", sets=_clustered(DEMO_SETS, 5, 0.8)),
        Scenario(f"clusters of 5, pooled drop {m:.0%}", [Step(drop={"*": m})], "rollback",
                 sets=_clustered(DEMO_SETS, 5, 0.8)),
        Scenario("length x1.00, 20 % cut at the budget", sets=cut_budget),
        Scenario("length x1.00, 40 % cut at the budget", sets=heavy_cut),
        Scenario("length x1.10 (the limit), 20 % cut", [Step(length={"*": 1.10})], "rollback",
                 sets=cut_budget),
        Scenario("length x1.10 (the limit), 40 % cut", [Step(length={"*": 1.10})], "rollback",
                 sets=heavy_cut),
        Scenario("length x1.15 on math/business/code only",
                 [Step(length={"math": 1.15, "business": 1.15, "code": 1.15})], "rollback"),
        Scenario("length x1.20 (2x the limit) in math only", [Step(length={"math": 1.20})],
                 "rollback"),
        Scenario("length x1.20 (2x the limit) in code only", [Step(length={"code": 1.20})],
                 "rollback"),
        Scenario("length x1.20 (2x the limit) in long context only",
                 [Step(length={"long_context": 1.20})], "rollback"),
        Scenario("length x1.05 per step over 3 stages", [Step(length={"*": 1.05**k})
                                                         for k in (1, 2, 3)], "rollback"),
        Scenario("KL at 0.3x the limit, 2k-token corpus", corpus_tokens=2048),
        Scenario("KL at the limit, heavy tails, 2k-token corpus", [Step(kl=1.0)], "rollback",
                 corpus_tokens=2048),
        Scenario("KL at the limit, heavy tails, 26k tokens", [Step(kl=1.0)], "rollback"),
        Scenario("KL 1.5x the limit, one 64-token block", [Step(kl=1.5)], "rollback",
                 corpus_tokens=64),
        Scenario("top-1 at the limit", [Step(top1=policy.tolerance("8bit").min_top1)],
                 "rollback"),
        Scenario("A/A, latency drift sigma 0.15", drift=0.15),
        Scenario("A/A, latency drift sigma 0.15, required", drift=0.15, latency_required=True),
        Scenario("true +20 % TPOT, required (limit +25 %)", [Step(tpot_increase=0.20)], "go80",
                 drift=0.15, latency_required=True),
        Scenario("true +30 % TPOT, required", [Step(tpot_increase=0.30)], "rollback", drift=0.15,
                 latency_required=True),
        Scenario("A/A, 0.5 % request errors", request_errors=0.005),
        Scenario("creep: -4 pts per step over 3 stages",
                 [Step(drop={"*": 0.04 * k}) for k in (1, 2, 3)], "rollback"),
        # Latency is advisory by default: it fails only on confident harm, and three rounds a
        # step rarely make a +52 % sum confident (reported, not a target); required, it adds
        # rounds while unresolved and an unresolved sum blocks.
        Scenario("creep: +15 % TPOT per step over 3 stages, advisory",
                 [Step(tpot_increase=1.15**k - 1) for k in (1, 2, 3)], "either"),
        Scenario("creep: +15 % TPOT per step over 3 stages, required",
                 [Step(tpot_increase=1.15**k - 1) for k in (1, 2, 3)], "rollback",
                 latency_required=True),
        Scenario("single set of 1,000 items, A/A", sets=SINGLE_1000),
        Scenario(f"single set of 1,000 items, drop {m:.0%}", [Step(drop={"*": m})], "rollback",
                 sets=SINGLE_1000),
        Scenario(f"single set of 1,000 items, drop {2 * m:.0%}", [Step(drop={"*": 2 * m})],
                 "never", sets=SINGLE_1000),
        Scenario("single set of 1,000 items at 5 %, A/A", sets=SINGLE_FLOOR),
        Scenario("single set of 1,000 items at 5 %, keeps a fifth", [Step(drop={"*": 0.04})],
                 "never", sets=SINGLE_FLOOR),
        Scenario("kv: 1,000-item long-context set, A/A", kv=True, sets=LONG_1000),
        Scenario(f"kv: 1,000 items, the 4k bucket loses {m:.0%}",
                 [Step(drop={"long_context.4k": m})], "rollback", kv=True, sets=LONG_1000),
        Scenario(f"kv: 1,000 items, the 4k bucket loses {2 * m:.0%}",
                 [Step(drop={"long_context.4k": 2 * m})], "never", kv=True, sets=LONG_1000),
    ]
    return rows


def meets(scenario: Scenario, rate: float) -> str:
    target = {"go": rate >= 0.95, "go80": rate >= 0.80, "rollback": rate <= 0.05,
              "never": rate == 0.0}
    return "" if scenario.expect not in target else "ok" if target[scenario.expect] else "MISS"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--near-target-trials", type=int, default=1000,
                        help="Trials for rows whose target is P(go) >= 95 %% or <= 5 %%.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", default="default", help="Policy name or path.")
    parser.add_argument("--only", default=None, help="Rows whose label contains this text.")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="Rows simulated in parallel processes.")
    args = parser.parse_args(argv)
    policy = load_policy(args.policy, Path.cwd())
    print("decide() over simulated runs; demo sets "
          + ", ".join(f"{s.name} {s.first}/{s.pool}" for s in DEMO_SETS)
          + f" items; up to {policy.quality.max_looks} looks; targets: go >= 95 %, "
          "go80 >= 80 %, rollback <= 5 %, never = 0 %")
    print(f"{'scenario':46} {'expected':>9} {'P(go)':>7} {'95 % CI':>15} {'n':>5}      "
          "blocking rules (share of runs)")
    rows = [(scenario, max(args.trials, args.near_target_trials) if scenario.near_target
             else args.trials) for scenario in scenarios(policy)
            if not args.only or args.only in scenario.label]
    with forked_pool(args.jobs) as pool:
        results = pool.imap(_row, [(scenario, policy, trials, args.seed)
                                   for scenario, trials in rows])
        for (scenario, trials), (rate, blocking) in zip(rows, results, strict=True):
            low, high = wilson(round(rate * trials), trials)
            top = ", ".join(f"{rule} {count / trials:.0%}" for rule, count in
                            sorted(blocking.items(), key=lambda kv: -kv[1])[:3])
            print(f"{scenario.label:46} {scenario.expect:>9} {rate:7.1%} "
                  f"[{low:6.1%}, {high:6.1%}] {trials:5} {meets(scenario, rate):>4}  {top}",
                  flush=True)


def _row(args: tuple[Scenario, GatePolicy, int, int]) -> tuple[float, dict]:
    return p_go(*args)


if __name__ == "__main__":
    main()
