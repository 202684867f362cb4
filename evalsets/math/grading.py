"""Grading for the math set: pull the final number out of a free-form answer, compare exactly."""

from __future__ import annotations

import re

_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?"
# "The answer is 42", "answer: $1,200", "#### 42": the model's own declared answer wins.
_DECLARED = re.compile(rf"(?:answer\s*(?:is|=|:)\s*:?|####)\s*\**\s*({_NUMBER})", re.IGNORECASE)
_ANY = re.compile(_NUMBER)


def extract_number(response: str) -> str | None:
    """The declared final answer, else the last number; normalised ('1,200.0' -> '1200')."""
    declared = _DECLARED.findall(response)
    candidates = declared or _ANY.findall(response)
    if not candidates:
        return None
    text = candidates[-1].replace(",", "").replace("$", "")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text or None


def is_correct(response: str, answer: str) -> bool:
    extracted = extract_number(response)
    if extracted is None:
        return False
    try:
        return float(extracted) == float(answer)
    except ValueError:
        return False


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """lm-eval hook: one response per doc in, the primary metric out."""
    return {"exact_match": float(is_correct(results[0], doc["answer"]))}
