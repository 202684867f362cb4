"""Grading and row check for the instruction-following set: evalsets.scorers' `instructions`
scorer (IFEval's checkers from if-verifiable, strict, every instruction must be followed)."""

from __future__ import annotations

from pathlib import Path

from evalsets.scorers import InstructionsScorer
from evalsets.userset import LINE, read_rows
from infra.errors import SpecError

SCORER = InstructionsScorer(kind="instructions")


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """lm-eval hook: one response per doc in, prompt-level strict accuracy out."""
    return {"prompt_strict": SCORER.score(results[0], doc)}


def check_rows(path: Path) -> None:
    """Every row's instructions are known, fully argued and checkable offline (contract check)."""
    for row in read_rows(path):
        found = SCORER.problem(row)
        if found is not None:
            field, why = found
            raise SpecError(f"{path}:{row[LINE]}: field {field!r} (id {row.get('id')!r}): {why}")
