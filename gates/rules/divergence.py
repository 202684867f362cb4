"""Per-token KL and top-1 agreement against the baseline, on the same tokens: gates.divergence."""

from __future__ import annotations

from gates.divergence import divergence_checks
from gates.rules import Column, Context, Rule, cell, find, register
from gates.verdict import Check, StageVerdict


class Divergence(Rule):
    name = "divergence"
    order = 30
    columns = (Column("kl", "KL (nats)", 10), Column("top1", "top-1", 20))

    def checks(self, context: Context) -> list[Check]:
        return divergence_checks(context.stage, context.policy)

    def cells(self, stage: StageVerdict, set_names: list[str]) -> dict[str, dict[str, str]]:
        missing = find(stage, "divergence")
        if missing:
            return dict.fromkeys(("kl", "top1"), cell(missing, "not measured"))
        kl, top1 = find(stage, "divergence.kl"), find(stage, "divergence.top1")
        return {
            "kl": cell(kl, f"{kl.details['mean_kl']:.4f} [{kl.details['ci_low']:.4f}, "
                           f"{kl.details['ci_high']:.4f}]" if kl else "-"),
            "top1": cell(top1, f"{top1.details['top1']:.1%} [{top1.details['ci_low']:.1%}, "
                               f"{top1.details['ci_high']:.1%}]" if top1 else "-"),
        }


register(Divergence())
