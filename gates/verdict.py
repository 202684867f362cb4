"""Verdict types: per-rule checks, per-stage results, the overall decision and rollback plan."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

# 2: checks carry status / required / details; the verdict carries the rollback plan, the
# candidate hash, the advisories and the policy it was judged by.
SCHEMA_VERSION = "2"

Status = Literal["pass", "fail", "inconclusive", "n/a"]


class Check(BaseModel):
    rule: str = Field(description="e.g. 'quality.math', 'latency.low.tpot_p50_ms'.")
    passed: bool = Field(description="False: this check blocks the go (a rollback).")
    reason: str = Field(description="Why it passed or failed, with the numbers.")
    value: float | None = None
    limit: float | None = None
    applicable: bool = Field(default=True, description="False: shown, but not part of the decision.")
    status: Status | None = Field(
        default=None,
        description="pass / fail / inconclusive (the data cannot bound the tolerance) / n/a. An "
        "inconclusive check blocks (passed=False) when its rule is required by the policy.",
    )
    required: bool = Field(default=True, description="Whether 'inconclusive' blocks the go.")
    details: dict[str, float | int | str | None] = Field(
        default_factory=dict, description="The statistics behind the check (CI, n, p, MDE...)."
    )

    @model_validator(mode="after")
    def _default_status(self) -> Check:
        if self.status is None:
            self.status = "n/a" if not self.applicable else ("pass" if self.passed else "fail")
        return self


class StageVerdict(BaseModel):
    stage: str
    kind: str
    parent: str | None
    passed: bool
    checks: list[Check]
    precision: str | None = Field(default=None, description="'8bit' or '4bit' tolerance class.")
    axes: dict[str, str] = Field(default_factory=dict)
    emulated: bool = False

    @property
    def failures(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]

    @property
    def advisories(self) -> list[Check]:
        """Not blocking, but not established either: shown next to every go."""
        return [c for c in self.checks if c.passed and c.status == "inconclusive"]


class RollbackPlan(BaseModel):
    """What to serve if the candidate is refused: the last configuration whose chain passed."""

    stage: str
    command: str | None = Field(description="The exact engine command line, ready to paste.")
    axes: dict[str, str] = Field(default_factory=dict)
    fingerprint: str | None = None
    passed_emulated: list[str] = Field(
        default_factory=list, description="Later stages whose chain passed but that served "
        "dequantized (emulated) weights: their format was never served, so the plan cannot be "
        "one of them.")

    def skipped(self) -> str:
        """Why a later stage that passed is not the plan ('' when none is)."""
        if not self.passed_emulated:
            return ""
        one = len(self.passed_emulated) == 1
        return (f"stage{'' if one else 's'} {', '.join(self.passed_emulated)} passed but served "
                f"dequantized (emulated) weights: {'its' if one else 'their'} format was never "
                f"served, so {'it is' if one else 'they are'} not a configuration to roll back to")


class RepairVerdict(BaseModel):
    """A repair stage's own verdict: the configuration a failed stage's diagnosis chose, built and
    served in the same run, judged on its chain (baseline .. its parent, itself) as the final."""

    stage: str
    repairs: str = Field(description="The failed stage it repairs.")
    configuration: str = Field(description="e.g. 'int4/group16, down_proj, v_proj as int8/channel'.")
    decision: Literal["go", "rollback"]
    reasons: list[str] = Field(default_factory=list)
    weight_bytes: int | None = None
    failed_weight_bytes: int | None = Field(None, description="The failed configuration's.")
    kv_bytes_per_token: int | None = Field(None, description="A KV-cache repair's cache bytes "
                                           "per token (gates.repair.kv_bytes).")
    failed_kv_bytes_per_token: int | None = Field(None, description="The failed cache's.")
    predicted_on: str | None = Field(None, description="The GPU `tpot_ms` is predicted on.")
    tpot_ms: dict[str, float] = Field(
        default_factory=dict, description="The what-if's one-user TPOT of the reference workload "
        "on `predicted_on`, by stage: the repair, the failed stage and the baseline, each in the "
        "format it would ship (a prediction, never a measurement).")
    command: str | None = Field(None, description="Its engine command, as served.")


class Verdict(BaseModel):
    schema_version: str = SCHEMA_VERSION
    candidate: str
    decision: Literal["go", "rollback"]
    stages: list[StageVerdict]
    accepted_stage: str | None = Field(description="Deepest stage whose whole chain passed.")
    rollback_command: str | None = Field(description="Engine command of the accepted stage.")
    reasons: list[str] = Field(default_factory=list, description="Every failed check, one line each.")
    advisories: list[str] = Field(
        default_factory=list,
        description="Inconclusive checks of non-required rules: what the go does NOT establish.",
    )
    rollback_plan: RollbackPlan | None = None
    candidate_hash: str | None = Field(
        default=None, description="sha256 (16 hex) of the final stage's served config and command."
    )
    policy: dict = Field(default_factory=dict, description="The gate policy this was judged by.")
    repairs: list[RepairVerdict] = Field(
        default_factory=list, description="Repairs built after a rollback, each with its verdict; "
        "the candidate's decision above is not changed by them.")

    @property
    def exit_code(self) -> int:
        return 0 if self.decision == "go" else 1

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=1))
        return path


# Check constructors shared by the rule modules.

def missing(rule: str, what: str, required: bool = True) -> Check:
    if required:
        return Check(rule=rule, passed=False, reason=f"{what} was not measured: fail closed")
    return Check(rule=rule, passed=True, status="inconclusive", required=False,
                 reason=f"{what} was not measured (rule not required: advisory)")


def judged(rule: str, outcome: Status, required: bool, reason: str, **fields) -> Check:
    """A check whose outcome came from a bound: inconclusive blocks only when required."""
    passed = outcome in ("pass", "n/a") or (outcome == "inconclusive" and not required)
    if outcome == "inconclusive":
        reason = ("inconclusive, counts as rollback: " if required else
                  "inconclusive (advisory, rule not required): ") + reason
    return Check(rule=rule, passed=passed, status=outcome, required=required, reason=reason,
                 **fields)


def points(x: float) -> str:
    return f"{100 * x:+.1f}"
