"""Validate's power of the whole decision: the spec's sets as simulated shapes, refused below policy."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from evalsets.contracts import data_files, load_contract
from evalsets.jsonl import read_jsonl
from evalsets.spec import EvalSetSpec
from flows.plan import Stage
from flows.spec import Spec
from gates.accuracy import groups_required
from gates.policy import GatePolicy, precision_class
from gates.power import SIMULATION_VERSION, DecisionPower, power_runs, simulate
from gates.simulate import SetShape
from infra.errors import SpecError
from infra.spread import spread

PLANNING_ACCURACY = 0.5  # the baseline's accuracy is unknown before it runs


def group_order(spec: EvalSetSpec) -> list[str]:
    """Each pool item's group (its contract's group field), in data order within any `groups`
    filter, as the runner takes its first items ("" for an item without one); [] for a set
    that declares none."""
    contract = load_contract(spec.info)
    if contract.group is None:
        return []
    order = []
    for path in data_files(spec.info):
        if path.suffix != ".jsonl":
            continue
        for row in read_jsonl(path):
            value = row.get(contract.group)
            label = "" if value is None else str(value)
            if spec.groups is None or (value is not None and label in spec.groups):
                order.append(label)
    return order


def group_values(spec: EvalSetSpec) -> list[str]:
    """The set's groups (its contract's group field), in data order, within any `groups` filter."""
    return [group for group in dict.fromkeys(group_order(spec)) if group]


def cluster_ids(spec: EvalSetSpec, pool: int) -> tuple[int, ...]:
    """Each pool item's cluster (its contract's cluster field) as an index, in data order within
    any `groups` filter, as the runner takes its first items; () for a set that declares none. An
    item with no value is a cluster of its own."""
    contract = load_contract(spec.info)
    if contract.cluster is None:
        return ()
    index: dict[str, int] = {}
    ids: list[int] = []
    for path in data_files(spec.info):
        if path.suffix != ".jsonl":
            continue
        for row in read_jsonl(path):
            if spec.groups is not None and contract.group is not None \
                    and str(row.get(contract.group)) not in spec.groups:
                continue
            value = row.get(contract.cluster)
            key = f"item {len(ids)}" if value is None else f"value {value}"
            ids.append(index.setdefault(key, len(index)))
    if len(ids) < pool:  # the pool is counted another way (a folder of files): plan unclustered
        return ()
    return tuple(ids[:pool])


def set_shapes(spec: Spec, pools: dict[str, int],
               cluster_rho: float = 0.0) -> tuple[SetShape, ...]:
    shapes = []
    for evalset in spec.evalsets:
        pool = pools[evalset.name]
        groups = group_values(evalset) or [""]
        clusters = cluster_ids(evalset, pool)
        budget = evalset.max_gen_toks or 256
        # Answers planned to fit their budget (about 1 in 70 cut): a set whose answers do not
        # fit is a problem of the set, which the length rules name once it runs.
        shapes.append(SetShape(evalset.name, evalset.first_look(pool), pool,
                               dict.fromkeys(groups, PLANNING_ACCURACY),
                               tokens=min(60.0, budget / 3), budget=budget,
                               samples=evalset.sampling.samples if evalset.sampling else 1,
                               clusters=clusters, cluster_rho=cluster_rho if clusters else 0.0))
    return tuple(shapes)


def check_decision_power(spec: Spec, stages: list[Stage], pools: dict[str, int],
                         policy: GatePolicy, trials: int = 100) -> list[DecisionPower]:
    """One simulation per kind of judgement the spec's stages get (precision class, per group or
    not); refuse the spec when an equivalent stage would go less often than the policy's power."""
    shapes = set_shapes(spec, pools, policy.quality.planning_cluster_rho)
    kinds: dict[tuple[str, bool], dict[str, str]] = {}
    for stage in stages:
        if stage.parent is None:
            continue
        axes = stage.axes.model_dump(exclude={"emulated"})
        kinds.setdefault((precision_class(axes), groups_required(axes, policy)), axes)
    plans = simulated(shapes, list(kinds.values()), policy, trials)
    for plan in plans:
        if plan.equivalent < policy.quality.power:
            raise SpecError(
                f"eval sets too small for the whole decision: {plan.describe(policy.quality.power)};"
                " raise the limits of the sets named as blocking, add items, or widen the margins "
                "in the gate policy")
    return plans


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "quantgate" / "power"


def _rules_digest() -> str:
    """The rules and the simulation as they are in this checkout: a changed rule is a new key."""
    import gates

    sources = sorted(Path(gates.__file__).parent.glob("*.py"))
    return hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()[:16]


def simulated(shapes: tuple[SetShape, ...], kinds: list[dict[str, str]], policy: GatePolicy,
              trials: int) -> list[DecisionPower]:
    """Each kind's figures, from this machine's cache or simulated: every simulation of every
    kind at once, spread over the cores (each has its own seed, so the figures are the same
    in any number of processes)."""
    keys = [_key(shapes, axes, policy, trials) for axes in kinds]
    plans = {key: _read(key) for key in keys}
    missing = {key: power_runs(shapes, axes, policy, trials)
               for key, axes in zip(keys, kinds, strict=True) if plans[key] is None}
    results = iter(spread(simulate, [job for runs in missing.values()
                                      for job in runs.jobs(policy)]))
    for key, runs in missing.items():
        plans[key] = runs.assemble([next(results) for _ in runs.scenarios])
        _write(key, plans[key])
    return [plans[key] for key in keys]  # type: ignore[misc]


def _key(shapes: tuple[SetShape, ...], axes: dict[str, str], policy: GatePolicy,
         trials: int) -> str:
    """The simulation is seeded, so its inputs name its result: a spec validated and then run,
    or the same sets in another spec, simulate once per machine (a few seconds each time)."""
    return hashlib.sha256(json.dumps(
        [SIMULATION_VERSION, _rules_digest(), [dataclasses.asdict(s) for s in shapes], axes,
         policy.model_dump(mode="json"), trials], sort_keys=True).encode()).hexdigest()[:24]


def _read(key: str) -> DecisionPower | None:
    try:
        return DecisionPower(**json.loads((_cache_dir() / f"{key}.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write(key: str, plan: DecisionPower) -> None:
    path = _cache_dir() / f"{key}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dataclasses.asdict(plan)))
    except OSError:
        pass  # a read-only home only costs the simulation next time
