"""Grading for the long-context family: every expected answer must appear in the response.

RULER's string_match_all, made binary: an item scores 1.0 when each answer (a number, a
variable name, a word) is found as a whole token, case-insensitively, else 0.0. A number inside
a longer number does not count ('1234567' is not in '12345678').
"""

from __future__ import annotations

import re


def found(answer: str, response: str) -> bool:
    pattern = rf"(?<![A-Za-z0-9]){re.escape(answer)}(?![A-Za-z0-9])"
    return re.search(pattern, response, flags=re.IGNORECASE) is not None


def score(answers: list[str], response: str) -> float:
    return float(bool(answers) and all(found(answer, response) for answer in answers))


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """lm-eval hook: one response per doc in, the primary metric out."""
    return {"match_all": score(list(doc["answers"]), results[0])}
