"""Gate rules as plug-ins: one module per rule, holding its checks, its report cells and (for a
rule added later) its own policy settings.

`gates.checks` runs every rule module of this package in the rules' `order`, and the report's headline
table takes one column per cell a rule declares, so neither lists the rules again. The built-in
rules keep their settings in their sections of the policy (`quality`, `divergence`, `length`, ...,
gates/policy.py); a rule added later declares a pydantic `settings` model and reads its section
under `rules: {<name>: ...}` of the policy YAML, validated when a run or a re-gate loads it
(`check_settings`: the policy is a part the rules depend on, not the other way round).

Adding a rule is one module here (a `Rule` subclass with its `order`, passed to `register`),
its settings in the YAML, and tests.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:  # the rules are imported by name (registered()), not at import time
    from gates.policy import GatePolicy
    from gates.record import StageRecord
    from gates.verdict import Check, StageVerdict

# The built-in rules' check order: asked the same way first (the other rules mean nothing
# otherwise), then quality, divergence, perplexity, latency, length; what it bought last. A rule
# added later takes ADDED unless it says otherwise: after the built-in gated rules.
ADDED = 100


@dataclass(frozen=True)
class Context:
    """What every rule is judged on: the stage, its parent, the baseline and the policy;
    `records` holds every stage by name, for rules that walk the whole chain."""

    stage: StageRecord
    parent: StageRecord
    baseline: StageRecord
    policy: GatePolicy
    records: Mapping[str, StageRecord] | None = None


@dataclass(frozen=True)
class Column:
    """One column of the report's headline table: its key in a row's cells and its header."""

    key: str
    header: str
    rank: int  # left to right in the table (quality first, divergence, ..., what it bought)
    gated: bool = True  # its cell shows the check's status (an engine fact is shown, not gated)


class Rule:
    """A gate rule: `checks` judges a stage; `cells` fills the report's columns from its checks."""

    name: ClassVar[str]
    order: ClassVar[int] = ADDED
    columns: ClassVar[tuple[Column, ...]] = ()
    settings: ClassVar[type[BaseModel] | None] = None  # a plug-in rule's policy section

    def checks(self, context: Context) -> list[Check]:
        raise NotImplementedError

    def cells(self, stage: StageVerdict, set_names: list[str]) -> dict[str, dict[str, str]]:
        return {}

    def options(self, policy: GatePolicy) -> BaseModel | None:
        """This rule's settings from the policy's `rules` section (defaults where it has none)."""
        if self.settings is None:
            return None
        return _settings(policy, self.name, "the gate policy")


_REGISTRY: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    _REGISTRY[rule.name] = rule
    return rule


def registered() -> list[Rule]:
    """Every rule of the package's modules (imported on first use), in check order."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return sorted(_REGISTRY.values(), key=lambda rule: rule.order)


def columns() -> list[Column]:
    return sorted((column for rule in registered() for column in rule.columns),
                  key=lambda column: column.rank)


def check_settings(policy: GatePolicy, source: str = "the gate policy") -> None:
    """The policy's `rules` sections: each names a rule that takes settings and is valid for it
    (SpecError naming the policy, the rule and the field)."""
    for name in policy.rules:
        _settings(policy, name, source)


def _settings(policy: GatePolicy, name: str, source: str) -> BaseModel:
    from infra.errors import SpecError, did_you_mean

    rules = {rule.name: rule for rule in registered()}
    rule = rules.get(name)
    if rule is None or rule.settings is None:
        takes = tuple(n for n, r in rules.items() if r.settings is not None)
        raise SpecError(f"{source}: rules.{name}: no rule of that name takes settings; "
                        f"{did_you_mean(name, takes) if takes else 'none does'}")
    try:
        return rule.settings.model_validate(policy.rules.get(name, {}))
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise SpecError(f"{source}: rules.{name}.{field}: {first['msg']}") from err


def cell(check: Check | None, text: str) -> dict[str, str]:
    return {"text": text, "status": check.status if check else "n/a"}


def find(stage: StageVerdict, rule: str) -> Check | None:
    return next((c for c in stage.checks if c.rule == rule), None)


def pts(x: Any) -> str:
    return f"{100 * float(x):+.1f}"
