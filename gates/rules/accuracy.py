"""Paired non-inferiority of accuracy, pooled, per set and per group: gates.accuracy."""

from __future__ import annotations

from gates.accuracy import quality_checks
from gates.rules import Context, Rule, cell, find, pts, register
from gates.verdict import Check, StageVerdict


class Accuracy(Rule):
    name = "quality"
    order = 20

    def checks(self, context: Context) -> list[Check]:
        return quality_checks(context.stage, context.parent, context.baseline, context.policy)

    def cells(self, stage: StageVerdict, set_names: list[str]) -> dict[str, dict[str, str]]:
        """One cell per set (the report puts them under the sets' names): the paired difference
        with its interval and the flips, or the reason the set was not judged."""
        out = {}
        for name in set_names:
            check = find(stage, f"quality.{name}")
            d = check.details if check else {}
            text = (f"{pts(d['difference'])} [{pts(d['ci_low'])}, {pts(d['ci_high'])}] pts; "
                    f"flips -{d['broke']}/+{d['fixed']}" if "ci_low" in d
                    else (check.reason if check else "-"))
            out[f"quality.{name}"] = cell(check, text)
        return out


register(Accuracy())
