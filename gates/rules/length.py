"""Output length (and reasoning-trace length) against the parent and the baseline: gates.length."""

from __future__ import annotations

import math

from gates.length import length_checks
from gates.rules import Column, Context, Rule, cell, find, register
from gates.verdict import Check, StageVerdict


class Length(Rule):
    name = "length"
    order = 60
    columns = (Column("length", "length", 40),)

    def checks(self, context: Context) -> list[Check]:
        return length_checks(context.stage, context.parent, context.policy, context.baseline)

    def cells(self, stage: StageVerdict, set_names: list[str]) -> dict[str, dict[str, str]]:
        c = find(stage, "length")
        return {"length": cell(c, f"x{math.exp(c.details['mean_log_ratio']):.3f} "
                                  f"[x{math.exp(c.details['ci_low']):.3f}, "
                                  f"x{math.exp(c.details['ci_high']):.3f}]"
                               if c and "ci_low" in c.details else (c.reason if c else "-"))}


register(Length())
