"""From stage records to one verdict: go only when every stage of the chain passed."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from gates.checks import stage_checks
from gates.diagnosis import Diagnosis
from gates.latency import error_rate_checks
from gates.policy import GatePolicy, precision_class
from gates.record import (
    CANDIDATE_NAME,
    STAGE_KINDS,
    STAGE_NAME,
    RunManifest,
    StageRecord,
    StoredRecordError,
)
from gates.repair import KvRepairOption
from gates.verdict import Check, RepairVerdict, RollbackPlan, StageVerdict, Verdict
from infra.errors import QuantgateError, did_you_mean


def _baseline_checks(baseline: StageRecord, policy: GatePolicy) -> list[Check]:
    if baseline.error:
        return [Check(rule="stage", passed=False, reason=f"baseline did not finish: {baseline.error}")]
    checks = [Check(rule="stage", passed=True, reason="baseline measured")]
    for what, value in (("quality", baseline.quality), ("load", baseline.load)):
        if value is None:
            checks.append(Check(rule=what, passed=False, reason=f"{what} was not measured"))
    if baseline.load:
        checks += error_rate_checks(baseline, policy)
    return checks


def candidate_hash(record: StageRecord) -> str:
    """Identifies what would ship: the served config fingerprint, axes and exact command line."""
    served = {
        "fingerprint": record.fingerprint, "axes": record.axes, "emulated": record.emulated,
        "command": record.facts.command_line() if record.facts else None,
        "version": record.facts.version if record.facts else None,
    }
    return hashlib.sha256(json.dumps(served, sort_keys=True).encode()).hexdigest()[:16]


def decide(candidate: str, records: list[StageRecord], policy: GatePolicy,
           final: str | None = None) -> Verdict:
    """Records in run order, baseline first. Go only when every stage of the tree passed.

    The candidate is the last stage that is not a control or a repair (or `final`, named); a
    control stage (the parent's exact configuration served again) is judged like any stage and
    must pass: it is the team's own noise floor, so a failing control blocks the go as surely as
    a failing sibling branch. A repair stage (built after the candidate's rollback) is judged
    like any stage but gets its own verdict (`repair_verdicts`): it neither blocks the
    candidate's go nor becomes a rollback target.
    """
    problem = chain_problem(records)
    if problem is not None:  # else a cycle would loop forever and a missing parent raise
        stage, why = problem
        where = f"stage {stage!r}" if stage is not None else f"stages {[r.name for r in records]}"
        raise QuantgateError(f"{where}: {why}")
    by_name = {record.name: record for record in records}
    baseline = records[0]
    if final is not None:
        final_record = by_name[final]
    else:
        measured = [r for r in records[1:] if r.kind not in ("control", "repair")]
        final_record = measured[-1] if measured else None
    verdicts: dict[str, StageVerdict] = {}
    for record in records:
        if record.parent is None:
            checks = _baseline_checks(record, policy)
        else:
            checks = stage_checks(record, by_name[record.parent], baseline, policy, by_name)
        if record is final_record and record.emulated:
            checks.append(Check(
                rule="servable", passed=False,
                reason="the candidate stage serves dequantized (emulated) weights: what would ship "
                "was never served or timed",
            ))
        verdicts[record.name] = StageVerdict(
            stage=record.name, kind=record.kind, parent=record.parent,
            passed=bool(checks) and all(c.passed for c in checks), checks=checks,
            precision=precision_class(record.axes), axes=record.axes, emulated=record.emulated,
        )

    def chain_passed(name: str | None) -> bool:
        while name is not None:
            if not verdicts[name].passed:
                return False
            name = by_name[name].parent
        return True

    # Only a configuration that was really served can be rolled back to; a control is a copy.
    passed = [r for r in records if chain_passed(r.name) and r.kind not in ("control", "repair")]
    accepted = next((r for r in reversed(passed) if not r.emulated), None)
    passed_emulated = ([r.name for r in passed[passed.index(accepted) + 1:] if r.emulated]
                       if accepted else [])
    judged = {name: v for name, v in verdicts.items()
              if by_name[name].kind != "repair" or name == final}
    final_ok = final_record is not None and all(v.passed for v in judged.values())
    # What failed for good leads, in stage order; the rules left inconclusive follow (a rule that
    # fails stops the looks, so the rest of its stage often stays unresolved behind it).
    failures = [(v, c) for v in judged.values() for c in v.failures]
    reasons = [f"{v.stage}: {c.rule}: {c.reason}"
               for v, c in sorted(failures, key=lambda pair: pair[1].status == "inconclusive")]
    if final_record is None:
        reasons.append("no candidate stage was measured")
    advisories = [f"{v.stage}: {c.rule}: {c.reason}" for v in judged.values() for c in v.advisories]
    command = accepted.facts.command_line() if accepted and accepted.facts else None
    return Verdict(
        candidate=candidate,
        decision="go" if final_ok else "rollback",
        stages=list(verdicts.values()),
        accepted_stage=accepted.name if accepted else None,
        rollback_command=command,
        reasons=reasons,
        advisories=advisories,
        rollback_plan=RollbackPlan(stage=accepted.name, command=command, axes=accepted.axes,
                                   fingerprint=accepted.fingerprint,
                                   passed_emulated=passed_emulated) if accepted else None,
        candidate_hash=candidate_hash(final_record or records[-1]),
        policy=policy.model_dump(mode="json"),
    )


def chain_problem(records: list[StageRecord]) -> tuple[str | None, str] | None:
    """Why the records do not make one run's tree, else None: (the stage whose record is wrong,
    or None where their order is, what is wrong and what to change). A run is the baseline (kind
    baseline, no parent) first, then stages of unique names, each after its parent: so every
    stage's chain ends at the baseline, and walking it always ends."""
    if not records:
        return None, "no stages: the run measured nothing: re-run the acceptance"
    by_name = {record.name: record for record in records}
    first = records[0]
    if first.parent is None and first.kind != "baseline":
        return first.name, (f"kind {first.kind!r} with no parent: the first stage is the run's "
                            "baseline, of kind 'baseline'; set kind to 'baseline' or re-run the "
                            "acceptance")
    if first.parent is not None:
        baseline = next((r.name for r in records if r.parent is None and r.kind == "baseline"),
                        None)
        if baseline is None:
            return first.name, (f"parent {first.parent!r}, and no stage of this run is the "
                                "baseline (kind 'baseline', no parent): re-run the acceptance")
        return None, (f"{first.name!r} (parent {first.parent!r}) is listed first, not the "
                      f"baseline {baseline!r}: list the baseline first, each stage after its "
                      "parent")
    seen = [first.name]
    for record in records[1:]:
        if record.name in seen:
            return record.name, (f"name {record.name!r} is another stage's too; names are unique "
                                 "in a run: re-run the acceptance")
        if record.parent is None:
            return record.name, (f"parent null (kind {record.kind!r}), but {first.name!r} is the "
                                 f"run's baseline: set parent to {_one_of(seen)}")
        if record.kind == "baseline":
            return record.name, (f"kind 'baseline' with parent {record.parent!r}; only the first "
                                 "stage is the baseline: set kind to the axis the stage changes")
        if record.parent not in seen:
            if record.parent == record.name:
                return record.name, (f"parent {record.parent!r} is the stage itself; a stage is "
                                     f"judged against one before it: set parent to {_one_of(seen)}")
            if record.parent not in by_name:
                return record.name, (f"parent {record.parent!r} is not a stage of this run: set "
                                     f"parent to a stage before it; "
                                     f"{did_you_mean(record.parent, seen)}")
            chain, name = [record.name], record.parent
            while name in by_name and name not in chain:
                chain.append(name)
                name = by_name[name].parent
            if name in chain:
                loop = " -> ".join(map(repr, [*chain[chain.index(name):], name]))
                return record.name, (f"parent {record.parent!r} makes a cycle ({loop}); every "
                                     f"chain ends at the baseline {first.name!r}: set parent to "
                                     f"{_one_of(seen)}")
            return None, (f"{record.name!r} is listed before its parent {record.parent!r}: list "
                          "the baseline first, each stage after its parent")
        seen.append(record.name)
    return None


def _one_of(names: list[str]) -> str:
    return repr(names[0]) if len(names) == 1 else f"one of {', '.join(map(repr, names))}"


def load_records(results_dir: Path) -> tuple[str, list[StageRecord]]:
    """Stage records from a results folder, in run order; StoredRecordError for a record this
    quantgate cannot read, a manifest entry that is not a stage folder of this run, or records
    that do not make one tree rooted at the baseline (a verdict on them would hang or mislead)."""
    manifest_path = results_dir / "manifest.json"
    manifest = RunManifest.read(results_dir)
    if not manifest.stages:
        raise StoredRecordError(f"{manifest_path}: lists no stages; the run measured nothing: "
                                "re-run the acceptance")
    if not re.fullmatch(CANDIDATE_NAME, manifest.candidate):
        raise StoredRecordError(f"{manifest_path}: candidate {manifest.candidate!r} is not a "
                                f"candidate name a spec allows ({CANDIDATE_NAME}); the manifest "
                                "was edited or damaged: re-run the acceptance")
    root = results_dir.resolve()
    for index, name in enumerate(manifest.stages):
        # A stage is a folder of this run: a path would gate another run's numbers as this one's.
        if not re.fullmatch(STAGE_NAME, name) or (results_dir / name).resolve().parent != root:
            raise StoredRecordError(
                f"{manifest_path}: stage entry {name!r} is not a stage folder of this run (a "
                f"stage name as a spec allows, {STAGE_NAME}: no '/', '..' or control "
                "characters); the manifest is damaged: re-run the acceptance")
        if name in manifest.stages[:index]:
            raise StoredRecordError(f"{manifest_path}: stage {name!r} is listed twice in stages; "
                                    "the manifest is damaged: re-run the acceptance")
    unlisted = sorted(path.parent.name for path in results_dir.glob("*/stage.json")
                      if path.parent.name not in manifest.stages)
    if unlisted:
        # A stage left out of the manifest is a verdict on part of the run (its failing stage).
        raise StoredRecordError(f"{manifest_path}: stages {manifest.stages} leave out the stage "
                                f"folder {unlisted[0]!r} of this run; the manifest is damaged: "
                                "re-run the acceptance")
    records = [StageRecord.read(results_dir / name) for name in manifest.stages]
    for name, record in zip(manifest.stages, records, strict=True):
        if record.name != name:
            raise StoredRecordError(
                f"{results_dir / name / 'stage.json'}: name {record.name!r} but its folder and "
                f"manifest entry are {name!r}; a stage's record is its own folder's: the record "
                "was moved or edited: re-run the acceptance")
        if record.kind not in STAGE_KINDS:
            raise StoredRecordError(
                f"{results_dir / name / 'stage.json'}: kind {record.kind!r} is not a stage kind, "
                f"{did_you_mean(record.kind, STAGE_KINDS)}; the record was edited or damaged: "
                "re-run the acceptance")
    problem = chain_problem(records)
    if problem is not None:
        stage, why = problem
        where = (f"{results_dir / stage / 'stage.json'}" if stage is not None else
                 f"{manifest_path}: stages {manifest.stages}")
        raise StoredRecordError(f"{where}: {why}")
    return manifest.candidate, records


def chain(records: list[StageRecord], name: str) -> list[StageRecord]:
    """The stage and its ancestors, in run order (baseline first)."""
    by_name = {r.name: r for r in records}
    names, at = set(), name
    while at is not None:
        names.add(at)
        at = by_name[at].parent
    return [r for r in records if r.name in names]


def repair_verdicts(candidate: str, records: list[StageRecord], policy: GatePolicy,
                    diagnoses: dict[str, Diagnosis]) -> list[RepairVerdict]:
    """Each repair stage's verdict, judged as the final stage of its own chain, with the speed the
    what-if predicts for it, the failed stage and the baseline (in the formats they would ship)."""
    from gates.whatif.section import DEFAULT_GPUS, one_user_tpot_ms

    by_name = {r.name: r for r in records}
    found = []
    for failed, diagnosis in diagnoses.items():
        stage = diagnosis.repair_stage
        if stage is None or stage not in by_name or diagnosis.repair is None:
            continue
        judged = chain(records, stage)
        verdict = decide(candidate, judged, policy, final=stage)
        facts = by_name[stage].facts
        compared = [r for r in (by_name[stage], by_name.get(failed), judged[0]) if r is not None]
        tpot = {r.name: one_user_tpot_ms(r) for r in compared}
        kv = isinstance(diagnosis.repair, KvRepairOption)
        sizes = ({"kv_bytes_per_token": diagnosis.repair.bytes,
                  "failed_kv_bytes_per_token": diagnosis.kv_bytes_per_token} if kv else
                 {"weight_bytes": diagnosis.repair.bytes,
                  "failed_weight_bytes": diagnosis.weight_bytes})
        found.append(RepairVerdict(
            stage=stage, repairs=failed, configuration=diagnosis.repair.name,
            decision=verdict.decision, reasons=verdict.reasons, **sizes,
            predicted_on=DEFAULT_GPUS[0],
            tpot_ms={name: round(ms, 4) for name, ms in tpot.items() if ms is not None},
            command=facts.command_line() if facts else None))
    return found
