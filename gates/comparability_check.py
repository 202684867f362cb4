"""The comparability rule: a stage is judged only when it was asked as the baseline was.

Apart from gates/comparability.py (what a stage record holds) because it reads whole records.
"""

from __future__ import annotations

from gates.comparability import recorded_differences
from gates.record import StageRecord
from gates.verdict import Check


def _first_difference(mine: list[str], theirs: list[str]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)


def _by_group(items: list) -> dict[str | None, list[str]]:
    out: dict[str | None, list[str]] = {}
    for item in items:
        out.setdefault(item.group, []).append(item.id)
    return out


def id_differences(stage: StageRecord, baseline: StageRecord) -> list[str]:
    """Item ids per set, from the stored items: the stage's items must be the baseline's, in the
    same order, over the items both scored (the baseline may hold more: a later stage's adaptive
    looks grew it); a stage with items the baseline never scored is not paired on them. A
    grouped set is compared group by group: a look may grow one group alone (gates.accuracy
    next_look), so two stages' groups can interleave differently, but each engine holds each
    group's first items, in that group's order."""
    if stage.quality is None or baseline.quality is None:
        return []
    out = []
    for name, task in stage.quality.tasks.items():
        theirs = baseline.quality.tasks.get(name)
        if theirs is None:
            out.append(f"set {name} was not measured on the baseline")
            continue
        their_groups = _by_group(theirs.items)
        for group, mine_ids in _by_group(task.items).items():
            their_ids = their_groups.get(group, [])
            where = "" if group is None else f" of group {group!r}"
            at = _first_difference(mine_ids, their_ids)
            if at is not None:
                out.append(f"set {name} item ids differ from the baseline's at item {at + 1}"
                           f"{where} ({mine_ids[at]!r} vs {their_ids[at]!r})")
            elif len(mine_ids) > len(their_ids):
                out.append(f"set {name}{where} {len(mine_ids)} items vs baseline "
                           f"{len(their_ids)} (items the baseline never scored)")
    for name in baseline.quality.tasks:
        if name not in stage.quality.tasks:
            out.append(f"set {name} was not measured on the stage (baseline has it)")
    return out


def comparability_check(stage: StageRecord, baseline: StageRecord) -> Check:
    """Fails closed on any difference from the baseline. A record stored before quantgate kept
    what it served has only its item ids checked, and says so."""
    differences = id_differences(stage, baseline)
    mine, theirs = stage.comparability, baseline.comparability
    if mine is not None and theirs is not None:
        differences = recorded_differences(mine, theirs) + differences
    if differences:
        return Check(rule="comparability", passed=False, reason="; ".join(differences),
                     details={"differences": len(differences)})
    if mine is None or theirs is None:
        missing = " and ".join(name for name, record in (("the stage", mine), ("the baseline", theirs))
                               if record is None)
        return Check(rule="comparability", passed=True, applicable=False,
                     reason=f"item ids match; chat template, tokenizer, generation settings and "
                     f"load profile not recorded for {missing} (stored by an older quantgate): "
                     "re-run the acceptance to check them")
    return Check(rule="comparability", passed=True,
                 reason=f"as the baseline: chat template {mine.chat_template}, tokenizer "
                 f"{mine.tokenizer}, generation settings and items of {len(mine.sets)} set(s), "
                 f"load profile {mine.load_profile} ({mine.load_prompts})")
