"""Grading for the code set: pull the code out of the response, run it with the item's asserts in
the sandbox, score pass@1 (1.0 when every assert passes)."""

from __future__ import annotations

import logging
import re

from evalsets.sandbox import SandboxResult, run_untrusted

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0
MEMORY_MB = 512

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_CODE_START = re.compile(r"^(?:def |class |import |from |@|async def )", re.MULTILINE)


def extract_code(response: str, entry_point: str) -> str:
    """The code the model meant: the fenced block that defines `entry_point` (python-tagged or
    untagged, closed or cut off), else the first fenced block, else the text from the first
    line that starts like Python code."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(response)]
    blocks = [(lang, body) for lang, body in blocks if lang in ("", "python", "py", "python3")]
    defining = [body for _, body in blocks if re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", body)]
    if defining:
        return defining[0]
    if blocks:
        return blocks[0][1]
    start = _CODE_START.search(response)
    return _longest_compiling_prefix(response[start.start() :]) if start else response


def _longest_compiling_prefix(text: str) -> str:
    """Unfenced code followed by prose: drop trailing lines until the rest compiles."""
    lines = text.splitlines()
    for end in range(len(lines), 0, -1):
        candidate = "\n".join(lines[:end]) + "\n"
        try:
            compile(candidate, "<response>", "exec")  # parses only, runs nothing
        except (SyntaxError, ValueError):
            continue
        return candidate
    return text


def grade(response: str, entry_point: str, tests: str) -> SandboxResult:
    return run_untrusted(extract_code(response, entry_point), tests, timeout_s=TIMEOUT_S, memory_mb=MEMORY_MB)


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """lm-eval hook: one greedy response per doc in, pass@1 out."""
    outcome = grade(results[0], doc["entry_point"], doc["tests"])
    log.debug("code item %s: %s", doc.get("id"), outcome.reason)
    return {"pass_at_1": float(outcome.passed)}
