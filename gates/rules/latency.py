"""Latency and errors under load, paired rounds against the reference: gates.latency."""

from __future__ import annotations

from gates.latency import load_checks
from gates.rules import Column, Context, Rule, cell, register
from gates.verdict import Check, StageVerdict


class Latency(Rule):
    name = "latency"
    order = 50
    columns = (Column("tpot", "TPOT", 50),)

    def checks(self, context: Context) -> list[Check]:
        return load_checks(context.stage, context.parent, context.baseline, context.policy,
                           context.records)

    def cells(self, stage: StageVerdict, set_names: list[str]) -> dict[str, dict[str, str]]:
        c = next((c for c in stage.checks if c.rule.endswith("tpot_p50_ms")), None)
        if c and "ci_low" in c.details:
            text = (f"{c.details['increase']:+.1%} [{c.details['ci_low']:+.1%}, "
                    f"{c.details['ci_high']:+.1%}]")
        elif c and c.value is not None:
            text = f"{c.value:+.1%}"
        else:  # not timed: why (emulated, contended, ...)
            text = next((x.reason.split(":")[0] for x in stage.checks
                         if x.rule.startswith("latency.") and not x.applicable), "-")
        return {"tpot": cell(c, text)}


register(Latency())
