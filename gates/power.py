"""The whole decision's power at a spec's sizes: P(go) for an equivalent stage and at the margin.

`quantgate validate` simulates the acceptance it is about to run (gates.trials): the spec's sets
at their first-look sizes and pools, with their groups, grown by the adaptive looks and judged by
every rule that items can block (the pooled, per-set and per-group accuracy rules, length), for
a stage as good as the baseline whose items flip at the policy's planning discordance (the
chance of a go: power) and for a stage that loses exactly the pooled margin (the chance of a
false go). Planning assumptions, stated with the figure: baseline accuracy 50 % in every group,
answers of about 60 tokens (a third of a smaller budget), divergence far inside its limits (the
corpus is not what a spec sizes), latency as a good stage's; in a sampled set, the k samples of
an item share their draws half the time (an item is easy or hard for every sample), so k samples
count for less than k items; a set that declares clusters keeps its real clusters, read from
its data, with the policy's `planning_cluster_rho` of a cluster's items moving together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gates.accuracy import serves_quantized_kv
from gates.policy import GatePolicy, precision_class
from gates.simulate import SetShape, Step
from gates.trials import Scenario, p_go, wilson

SIMULATION_VERSION = 9  # raise when the simulation or the rules change what it predicts


@dataclass
class DecisionPower:
    precision: str
    per_group: bool
    trials: int
    equivalent: float  # P(go) of a stage as good as the baseline
    at_margin: float  # P(go) of a stage that loses the pooled margin: the false-go risk
    blocking: dict[str, int]  # rules that blocked the equivalent stage, by count
    # P(go) when only the least-resolved set (or, judged per group, one group) loses the margin
    # while the rest hold: the false-go risk of a loss the pooled figure dilutes.
    one_set: str | None = None
    at_margin_one_set: float | None = None

    def describe(self, target: float) -> str:
        low, high = wilson(round(self.equivalent * self.trials), self.trials)
        m_low, m_high = wilson(round(self.at_margin * self.trials), self.trials)
        top = ", ".join(f"{rule} {count / self.trials:.0%}" for rule, count in
                        sorted(self.blocking.items(), key=lambda kv: -kv[1])[:3])
        return (f"{self.precision}{' (per group: KV cache)' if self.per_group else ''}: whole "
                f"decision P(go) {self.equivalent:.0%} [{low:.0%}, {high:.0%}] for an equivalent "
                f"stage (policy {target:.0%}), {self.at_margin:.0%} [{m_low:.0%}, {m_high:.0%}] "
                f"at the margin (false go)"
                + (f", {self.at_margin_one_set:.0%} when only {self.one_set} loses it"
                   if self.one_set is not None and self.at_margin_one_set is not None else "")
                + f", {self.trials} simulated runs each"
                + (f"; blocking when equivalent: {top}" if top else ""))


@dataclass(frozen=True)
class PowerRuns:
    """The simulations behind one DecisionPower, each with its own seed: run in any order or in
    any number of processes, they give the same figures."""

    precision: str
    per_group: bool
    trials: int
    scenarios: tuple[tuple[Scenario, int], ...]  # equivalent, at the margin[, one set], seeds
    one_set: str | None

    def jobs(self, policy: GatePolicy) -> list[tuple[Scenario, GatePolicy, int, int]]:
        return [(scenario, policy, self.trials, seed) for scenario, seed in self.scenarios]

    def assemble(self, results: list[tuple[float, dict]]) -> DecisionPower:
        (p_equivalent, blocking), (p_margin, _), *one = results
        return DecisionPower(precision=self.precision, per_group=self.per_group,
                             trials=self.trials, equivalent=p_equivalent, at_margin=p_margin,
                             blocking=blocking, one_set=self.one_set if one else None,
                             at_margin_one_set=one[0][0] if one else None)


def power_runs(shapes: tuple[SetShape, ...], axes: dict[str, str], policy: GatePolicy,
               trials: int = 100) -> PowerRuns:
    """The simulated runs of the whole decision at these sets: an equivalent stage, a stage that
    loses the pooled margin, and one whose least-resolved set alone loses it."""
    precision = precision_class(axes)
    margin = policy.tolerance(precision).accuracy_margin
    flips = policy.quality.planning_discordance
    # Items, not the scoring corpus, are planned here: a small corpus with a stage far inside
    # the divergence limits keeps those rules out of the figure (and the simulation fast).
    common = {"sets": shapes, "axes": axes, "flips": flips, "corpus_tokens": 64 * 40}
    clean = {"kl": 0.05, "top1": 0.995}
    seed = int(np.random.default_rng(policy.quality.seed).integers(2**31))
    scenarios = [(Scenario("equivalent", [Step(**clean)], **common), seed),
                 (Scenario("at the margin", [Step(drop={"*": margin}, **clean)], **common),
                  seed + 1)]
    one = least_resolved(shapes, serves_quantized_kv(axes))
    if one is not None and len(shapes) + sum(len(s.groups) > 1 for s in shapes) > 1:
        scenarios.append((Scenario(f"only {one} at the margin",
                                   [Step(drop={one: margin}, **clean)], **common), seed + 2))
    return PowerRuns(precision, serves_quantized_kv(axes), trials, tuple(scenarios), one)


def simulate(job: tuple[Scenario, GatePolicy, int, int]) -> tuple[float, dict]:
    """One simulated run (a process pool's unit of work)."""
    return p_go(*job)


def decision_power(shapes: tuple[SetShape, ...], axes: dict[str, str], policy: GatePolicy,
                   trials: int = 100) -> DecisionPower:
    """Simulated P(go) of the whole decision at these sets, for an equivalent and a marginal stage."""
    runs = power_runs(shapes, axes, policy, trials)
    return runs.assemble([simulate(job) for job in runs.jobs(policy)])


def least_resolved(shapes: tuple[SetShape, ...], per_group: bool) -> str | None:
    """The set with the fewest items in its pool, or (judged per group) the smallest group of a
    grouped set, as `set` or `set.group`: where a loss at the margin is likeliest to slip by."""
    if not shapes:
        return None
    if per_group:
        grouped = [(s.pool / len(s.groups), f"{s.name}.{s.groups[-1]}") for s in shapes
                   if len(s.groups) > 1]
        if grouped:
            return min(grouped)[1]
    return min(shapes, key=lambda s: s.pool).name
