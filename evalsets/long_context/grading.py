"""Grading for the long-context set: the first five-digit number in the answer must be the key."""

from __future__ import annotations

import re

_KEY = re.compile(r"(?<!\d)\d{5}(?!\d)")


def extract_key(response: str) -> str | None:
    """The first standalone five-digit number ('1,234' and longer numbers do not count)."""
    found = _KEY.search(response)
    return found.group(0) if found else None


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """lm-eval hook: one response per doc in, the primary metric out."""
    return {"exact_match": float(extract_key(results[0]) == doc["answer"])}
