"""Asked the same way as the baseline (template, tokenizer, generation, items, load): gates.comparability."""

from __future__ import annotations

from gates.comparability_check import comparability_check
from gates.rules import Context, Rule, register
from gates.verdict import Check


class Comparability(Rule):
    name = "comparability"
    order = 10

    def checks(self, context: Context) -> list[Check]:
        return [comparability_check(context.stage, context.baseline)]


register(Comparability())
