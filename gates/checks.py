"""Gate checks: pure functions of a stage's record, its parent's and the baseline's.

Every rule is a plug-in (gates/rules/): this runs the registered ones in their order."""

from __future__ import annotations

from collections.abc import Mapping

from gates.accuracy import at_sizes
from gates.policy import GatePolicy
from gates.record import StageRecord
from gates.rules import Context, registered
from gates.verdict import Check


def stage_checks(
    stage: StageRecord, parent: StageRecord, baseline: StageRecord, policy: GatePolicy,
    records: Mapping[str, StageRecord] | None = None,
) -> list[Check]:
    """`records`: every stage by name, so that cumulative rules can walk the whole chain."""
    if stage.error:
        return [Check(rule="stage", passed=False, reason=f"stage did not finish: {stage.error}")]
    if parent.error:
        return [Check(rule="stage", passed=False,
                      reason=f"parent {parent.name!r} did not finish: nothing to compare with")]
    # Judged on its own items: those it answered later as a served-again parent are its child's.
    own = stage.quality.own_sizes if stage.quality is not None else None
    stage = stage if own is None else at_sizes(stage, own)
    context = Context(stage, parent, baseline, policy, records)
    return [check for rule in registered() for check in rule.checks(context)]
