"""From stage records to one verdict: go only when every stage of the chain passed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gates.checks import stage_checks
from gates.latency import error_rate_checks
from gates.policy import GatePolicy, precision_class
from gates.record import RunManifest, StageRecord, StoredRecordError
from gates.verdict import Check, RollbackPlan, StageVerdict, Verdict


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


def decide(candidate: str, records: list[StageRecord], policy: GatePolicy) -> Verdict:
    """Records in run order, baseline first. Go only when every stage of the tree passed.

    The candidate is the last stage that is not a control; a control stage (the parent's exact
    configuration served again) is judged like any stage and must pass: it is the team's own
    noise floor, so a failing control blocks the go as surely as a failing sibling branch.
    """
    by_name = {record.name: record for record in records}
    baseline = records[0]
    measured = [r for r in records[1:] if r.kind != "control"]
    final = measured[-1] if measured else None
    verdicts: dict[str, StageVerdict] = {}
    for record in records:
        if record.parent is None:
            checks = _baseline_checks(record, policy)
        else:
            checks = stage_checks(record, by_name[record.parent], baseline, policy, by_name)
        if record is final and record.emulated:
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
    accepted = next((r for r in reversed(records)
                     if chain_passed(r.name) and not r.emulated and r.kind != "control"), None)
    final_ok = final is not None and all(v.passed for v in verdicts.values())
    reasons = [
        f"{v.stage}: {c.rule}: {c.reason}" for v in verdicts.values() for c in v.failures
    ]
    if final is None:
        reasons.append("no candidate stage was measured")
    advisories = [f"{v.stage}: {c.rule}: {c.reason}" for v in verdicts.values() for c in v.advisories]
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
                                   fingerprint=accepted.fingerprint) if accepted else None,
        candidate_hash=candidate_hash(final or records[-1]),
        policy=policy.model_dump(mode="json"),
    )


def load_records(results_dir: Path) -> tuple[str, list[StageRecord]]:
    """Stage records from a results folder, in run order; StoredRecordError for a record this
    quantgate cannot read or a manifest entry that is not a stage folder of this run."""
    manifest = RunManifest.read(results_dir)
    if not manifest.stages:
        raise StoredRecordError(f"{results_dir / 'manifest.json'}: lists no stages; the run "
                                "measured nothing: re-run the acceptance")
    root = results_dir.resolve()
    for name in manifest.stages:
        # A stage is a folder of this run: a path would gate another run's numbers as this one's.
        plain = name not in ("", ".", "..") and "/" not in name and "\\" not in name
        if not plain or (results_dir / name).resolve().parent != root:
            raise StoredRecordError(
                f"{results_dir / 'manifest.json'}: stage entry {name!r} is not a stage folder of "
                "this run (a plain stage name, no '/' or '..'); the manifest is damaged: re-run "
                "the acceptance")
    records = [StageRecord.read(results_dir / name) for name in manifest.stages]
    return manifest.candidate, records
