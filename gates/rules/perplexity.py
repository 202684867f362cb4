"""Corpus perplexity against the parent and the baseline, paired per token: gates.divergence."""

from __future__ import annotations

from gates.divergence import perplexity_checks
from gates.rules import Column, Context, Rule, cell, find, register
from gates.verdict import Check, StageVerdict


class Perplexity(Rule):
    name = "perplexity"
    order = 40
    columns = (Column("perplexity", "perplexity", 30),)

    def checks(self, context: Context) -> list[Check]:
        return perplexity_checks(context.stage, context.parent, context.baseline, context.policy)

    def cells(self, stage: StageVerdict, set_names: list[str]) -> dict[str, dict[str, str]]:
        c = find(stage, "perplexity.baseline") or find(stage, "perplexity.parent")
        return {"perplexity": cell(c, f"{c.details['perplexity']:.3f} ({c.value:+.1%} "
                                      f"[{c.details['ci_low']:+.1%}, {c.details['ci_high']:+.1%}])"
                                   if c and c.value is not None else "-")}


register(Perplexity())
