"""Validate's whole-decision power: the spec's sets as simulated shapes, refused below the policy."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evalsets.spec import EvalSetSpec
from flows.axes import Axes
from flows.power import check_decision_power, group_values, set_shapes
from gates.policy import GatePolicy
from infra.errors import SpecError

W8A8 = Axes(weights="int8/channel", activations="int8/token/dynamic", kv_cache="auto")
KV = W8A8.model_copy(update={"kv_cache": "fp8_e4m3"})


def stages(*axes: Axes) -> list[SimpleNamespace]:
    base = SimpleNamespace(parent=None, axes=Axes(weights="none", activations="none",
                                                  kv_cache="auto"))
    return [base] + [SimpleNamespace(parent="baseline", axes=a) for a in axes]


def test_shapes_carry_sizes_pools_groups_and_budgets(tmp_path):
    sets = [EvalSetSpec(name="math", limit=60, max_gen_toks=30),
            EvalSetSpec(name="long_context", limit=40, groups=["512", "4k"])]
    assert group_values(sets[1]) == ["512", "4k"]
    math, long_context = set_shapes(SimpleNamespace(evalsets=sets),
                                    {"math": 1040, "long_context": 60})
    assert (math.first, math.pool, math.groups, math.budget) == (60, 1040, [""], 30)
    assert math.tokens == 10  # planned to fit a small budget
    assert long_context.groups == ["512", "4k"] and long_context.first == 40


def test_a_spec_too_small_for_its_kv_stage_is_refused_with_what_blocks(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    spec = SimpleNamespace(evalsets=[EvalSetSpec(name="math", limit=60),
                                     EvalSetSpec(name="long_context", limit=40)])
    # 19 per bucket at most, below min_items: enough for a stage judged per set, not for a KV
    # stage judged per group.
    pools = {"math": 1040, "long_context": 76}
    plans = check_decision_power(spec, stages(W8A8), pools, GatePolicy(), trials=30)
    assert len(plans) == 1 and not plans[0].per_group and plans[0].equivalent >= 0.8
    assert plans[0].at_margin <= 0.1
    with pytest.raises(SpecError, match=r"per group: KV cache.*quality\.long_context\.") as err:
        check_decision_power(spec, stages(W8A8, KV), pools, GatePolicy(), trials=30)
    assert "raise the limits" in str(err.value)
    assert list((tmp_path / "quantgate" / "power").glob("*.json"))  # simulated once, kept


def test_validate_names_the_false_go_risk_of_one_set_losing_the_margin(monkeypatch, tmp_path):
    """The pooled margin's false-go figure dilutes one set's loss over the sets: validate also
    simulates the least-resolved set alone losing the margin, and says what that would do."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    spec = SimpleNamespace(evalsets=[EvalSetSpec(name="math", limit=60),
                                     EvalSetSpec(name="code", limit=20)])
    plan, = check_decision_power(spec, stages(W8A8), {"math": 1040, "code": 160}, GatePolicy(),
                                 trials=30)
    assert plan.one_set == "code" and plan.at_margin_one_set is not None
    assert plan.at_margin_one_set > plan.at_margin  # a diluted loss slips by more often
    assert "when only code loses it" in plan.describe(0.8)


def test_a_sampled_set_is_planned_with_its_samples_and_they_buy_power_but_not_k_items():
    from gates.simulate import SetShape, Step
    from gates.trials import Scenario, p_go

    sets = [EvalSetSpec(name="math", limit=60, sampling={"samples": 4})]
    (math,) = set_shapes(SimpleNamespace(evalsets=sets), {"math": 240})
    assert math.samples == 4
    policy = GatePolicy()

    def blocked(samples: int, items: int) -> int:
        """Simulated runs of an equivalent stage whose pooled accuracy rule did not pass."""
        shape = SetShape("math", items, items, {"": 0.5}, samples=samples)
        scenario = Scenario("equivalent", [Step(kl=0.05, top1=0.995)], sets=(shape,),
                            corpus_tokens=2560, flips=policy.quality.planning_discordance)
        return p_go(scenario, policy, 30, 7)[1].get("quality.accuracy", 0)

    # Four samples of 60 items resolve accuracy better than one sample, and no better than 240
    # items would: an item's samples share their draws.
    assert blocked(1, 60) > blocked(4, 60) >= blocked(1, 240)


def test_a_set_that_declares_clusters_is_planned_with_its_own_clusters(monkeypatch, tmp_path):
    """Validate plans with each set's real clusters (its template), read from its data, and the
    policy's planning correlation; a set without a cluster field is planned item by item."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    sets = [EvalSetSpec(name="math", limit=60), EvalSetSpec(name="code", limit=20)]
    math, code = set_shapes(SimpleNamespace(evalsets=sets), {"math": 1040, "code": 160},
                            cluster_rho=0.3)
    assert len(math.clusters) == 1040 and 5 <= len(set(math.clusters)) < 100
    assert math.cluster_rho == 0.3 and math.clustered
    assert code.clusters == () and code.cluster_rho == 0.0 and not code.clustered

    def plan(rho: float):
        policy = GatePolicy.model_validate({"quality": {"planning_cluster_rho": rho}})
        spec = SimpleNamespace(evalsets=[EvalSetSpec(name="math", limit=60)])
        return check_decision_power(spec, stages(W8A8), {"math": 240}, policy, trials=30)[0]

    # Items of one template that move together count for fewer: the same 60 -> 240 items that
    # plan well item by item are refused when a template's items move together, naming the set.
    assert plan(0.0).equivalent >= 0.8
    with pytest.raises(SpecError, match=r"whole decision.*blocking when equivalent:.*quality\.math"):
        plan(0.9)


def test_the_simulations_spread_over_processes_give_the_figures_of_one(monkeypatch, tmp_path):
    """Validate's simulations run in worker processes, each with its own seed: the same figures
    as one process running them in turn, whatever the number of workers."""
    from flows.power import simulated
    from gates.power import decision_power

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    sets = [EvalSetSpec(name="math", limit=60), EvalSetSpec(name="code", limit=20)]
    shapes = set_shapes(SimpleNamespace(evalsets=sets), {"math": 240, "code": 80})
    kinds = [W8A8.model_dump(exclude={"emulated"}), KV.model_dump(exclude={"emulated"})]
    spread = simulated(shapes, kinds, GatePolicy(), trials=12)
    alone = [decision_power(shapes, axes, GatePolicy(), trials=12) for axes in kinds]
    assert spread == alone and spread[0].one_set == "code"
    assert len(list((tmp_path / "quantgate" / "power").glob("*.json"))) == 2
