"""Regular expressions that judge answers: searched with a time bound, and refused at validate when
they cannot judge (not a regular expression, one Python warns about, one that backtracks without
end: a repeat nested in a repeat, or a repeated part that matches one text in more than one way,
evalsets.backtracking). The scorers (evalsets.scorers), IFEval's arguments
(evalsets.instruction_checks) and the code sets' tests (evalsets.task_code) share them.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from evalsets.backtracking import ambiguous_repeat
from infra.errors import MeasurementError

# One search of one answer: a sane pattern takes microseconds; past this it is backtracking.
REGEX_TIMEOUT_S = 1.0


def score_regex(response: str, pattern: str) -> bool:
    """The pattern is found in the response (anchor it with ^...$ for a whole-answer match).

    Searched with the `regex` package (it comes with lm-eval), whose search takes a timeout:
    a pattern that backtracks without end fails the measurement, in one line, instead of
    hanging it (validate already refuses the nested repeats that do so: nested_repeat)."""
    import regex

    try:
        return regex.search(pattern, response, timeout=REGEX_TIMEOUT_S) is not None
    except TimeoutError as exc:
        raise MeasurementError(
            f"regex scorer: pattern {pattern!r} took over {REGEX_TIMEOUT_S:g} s on a "
            f"{len(response):,}-character answer (backtracking); simplify the pattern") from exc


def nested_repeat(pattern: str) -> str | None:
    """Why a pattern can take exponential time, or None: an unbounded repeat (*, +, {n,})
    inside another, as in '(a+)+$', backtracks through every split of an answer that almost
    matches. Possessive ('a++') and atomic ('(?>a+)') repeats do not backtrack and pass."""
    from re import _constants as sre
    from re import _parser

    def unbounded(op: object, arg: tuple) -> bool:
        return op in (sre.MAX_REPEAT, sre.MIN_REPEAT) and arg[1] == sre.MAXREPEAT

    def nests(items: object, inside: bool) -> bool:
        for op, arg in items:
            if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
                if unbounded(op, arg) and inside:
                    return True
                if nests(arg[2], inside or unbounded(op, arg)):
                    return True
            elif op == sre.SUBPATTERN and nests(arg[3], inside):
                return True
            elif op == sre.BRANCH and any(nests(branch, inside) for branch in arg[1]):
                return True
            elif op in (sre.ASSERT, sre.ASSERT_NOT) and nests(arg[1], inside):
                return True
            elif op == sre.GROUPREF_EXISTS and any(nests(part, inside) for part in arg[1:]
                                                   if part is not None):
                return True
        return False

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # regex_problem reports them; the parser warns each time
        parsed = _parser.parse(pattern)
    if not nests(parsed, False):
        return None
    return (f"pattern {pattern!r} nests a repeat inside a repeat (like '(a+)+'), which can take "
            "exponential time on an answer that almost matches; write it without the nesting, "
            "or make the inner repeat possessive ('a++') or atomic ('(?>a+)')")


def regex_problem(pattern: str) -> str | None:
    """Why a pattern cannot score answers, or None: not a regular expression (for Python's re
    and the regex package that searches it), one Python warns about (a FutureWarning such as
    "Possible nested set": it will read differently in a later Python, and the warning line
    would reach the user), or one that backtracks exponentially."""
    from re import _parser

    import regex

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            _parser.parse(pattern)  # warns on every parse; re.compile warns once per process
            re.compile(pattern)
            regex.compile(pattern)
        except (re.error, regex.error, RecursionError, OverflowError) as exc:
            return f"pattern {pattern!r} is not a regular expression: {exc}"
    if caught:
        warning = caught[0]
        return (f"pattern {pattern!r}: Python warns \"{warning.message}\" "
                f"({warning.category.__name__}), so a later Python reads it differently: escape "
                "the character there with a backslash (inside [...], a literal '[' as '\\[', and "
                "'--', '&&', '~~', '||' as '\\-\\-', '\\&\\&', '\\~\\~', '\\|\\|')")
    return nested_repeat(pattern) or ambiguous_repeat(pattern)


def schema_patterns(schema: Any, where: str = "") -> list[tuple[str, str]]:
    """(JSON path, pattern) of every regular expression a JSON Schema holds: `pattern` values
    and `patternProperties` keys, which jsonschema searches with Python's re (no time bound)."""
    found: list[tuple[str, str]] = []
    if isinstance(schema, dict):
        for key, value in schema.items():
            path = f"{where}/{key}"
            if key == "pattern" and isinstance(value, str):
                found.append((path, value))
            elif key == "patternProperties" and isinstance(value, dict):
                found.extend((f"{path}/{name}", name) for name in value if isinstance(name, str))
            found.extend(schema_patterns(value, path))
    elif isinstance(schema, list):
        for index, value in enumerate(schema):
            found.extend(schema_patterns(value, f"{where}/{index}"))
    return found


def check_schema(schema: Any) -> None:
    """jsonschema's check of a schema (SchemaError): its `regex` format compiles each pattern
    with re, whose warnings schema_patterns_problem reports in one line instead."""
    from jsonschema.validators import validator_for

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        validator_for(schema).check_schema(schema)


def schema_patterns_problem(schema: Any) -> str | None:
    """Why a schema's patterns cannot judge answers (see regex_problem), naming where, or None."""
    for path, pattern in schema_patterns(schema):
        problem = regex_problem(pattern)
        if problem is not None:
            return f"{path or '/'}: {problem}"
    return None
