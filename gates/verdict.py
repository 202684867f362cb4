"""Verdict types: per-rule checks, per-stage results, the overall decision and rollback plan."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

SCHEMA_VERSION = "1"


class Check(BaseModel):
    rule: str = Field(description="e.g. 'quality.math', 'latency.tpot_p50'.")
    passed: bool
    reason: str = Field(description="Why it passed or failed, with the numbers.")
    value: float | None = None
    limit: float | None = None
    applicable: bool = Field(default=True, description="False: shown, but not part of the decision.")


class StageVerdict(BaseModel):
    stage: str
    kind: str
    parent: str | None
    passed: bool
    checks: list[Check]

    @property
    def failures(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]


class Verdict(BaseModel):
    schema_version: str = SCHEMA_VERSION
    candidate: str
    decision: Literal["go", "rollback"]
    stages: list[StageVerdict]
    accepted_stage: str | None = Field(description="Deepest stage whose whole chain passed.")
    rollback_command: str | None = Field(description="Engine command of the accepted stage.")
    reasons: list[str] = Field(default_factory=list, description="Every failed check, one line each.")

    @property
    def exit_code(self) -> int:
        return 0 if self.decision == "go" else 1

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=1))
        return path
