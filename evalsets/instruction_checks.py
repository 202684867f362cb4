"""IFEval's verifiable instructions, checked by PyPI's `if-verifiable` (Google's IFEval checkers).

A row names its instructions as IFEval does: `instruction_id_list` (e.g. "punctuation:no_comma")
and one `kwargs` object per instruction. The response scores 1.0 when it follows every
instruction in strict mode (the response as it is, IFEval's prompt-level strict accuracy).

Three things the library leaves loose are made strict here, before any engine starts:
an unknown instruction id (the library skips it silently), a missing argument (the library
draws a random one, so two stages would be judged on different instructions), and an
instruction whose checker needs data that is not installed (NLTK's Punkt tables: nothing is
downloaded at run time). langdetect, which the case checkers call, is seeded: its guesses are
otherwise random from one call to the next.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

from infra.errors import MeasurementError, did_you_mean

INSTALL_HINT = "if-verifiable is missing: pip install if-verifiable==0.1.2"
# Checkers that tokenize with NLTK's Punkt tables (nltk.word_tokenize / sent_tokenize).
NLTK_DATA = {
    "length_constraints:number_sentences": "tokenizers/punkt_tab/english/",
    "change_case:capital_word_frequency": "tokenizers/punkt_tab/english/",
}


@cache
def registry() -> dict[str, type]:
    """IFEval's checkers by instruction id."""
    try:
        import langdetect
        from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT
    except ImportError as exc:
        raise MeasurementError(INSTALL_HINT) from exc
    langdetect.DetectorFactory.seed = 0
    return dict(INSTRUCTION_DICT)


def arguments(instruction_id: str) -> list[str]:
    """The arguments an instruction's checker takes (each must be given)."""
    signature = inspect.signature(registry()[instruction_id].build_description)
    return [name for name in signature.parameters if name != "self"]


def missing_data(instruction_id: str) -> str | None:
    """Why an instruction cannot be checked offline here, or None."""
    resource = NLTK_DATA.get(instruction_id)
    if resource is None:
        return None
    import nltk

    try:
        nltk.data.find(resource)
    except LookupError:
        return (f"instruction {instruction_id!r} needs NLTK's {resource.split('/')[1]!r} data, "
                "which is not installed (nothing is downloaded at run time): install it at setup "
                f"with `python -m nltk.downloader punkt_tab`, or drop the instruction")
    return None


# Arguments IFEval's checkers splice into a regular expression (searched with re, no time bound):
# the pattern each builds, as instructions.py writes it.
REGEX_ARGUMENTS = {
    "keywords": "{}", "keyword": "{}", "forbidden_words": r"\b{}\b", "starter": r"^\s*{}.*$",
    "section_spliter": r"\s?{}\s?\d+\s?", "postscript_marker": r"\s*{}.*$",
}


def regex_argument_problem(instruction_id: str, given: dict[str, Any]) -> str | None:
    """Why an argument the checker reads as a regular expression cannot judge answers: 'C++'
    fails to compile while scoring, '[[x]' makes Python print a FutureWarning, '(a+)+' can take
    exponential time (evalsets.patterns.regex_problem); None when every one is fine."""
    import re

    from evalsets.patterns import regex_problem

    for name, template in REGEX_ARGUMENTS.items():
        values = given.get(name)
        if name == "postscript_marker" and values in ("P.P.S", "P.S."):
            continue  # the checker has its own pattern for these two
        for value in values if isinstance(values, list) else [values]:
            if not isinstance(value, str):
                continue
            if name == "postscript_marker":
                value = value.lower()
            problem = regex_problem(template.format(value))
            if problem is not None:
                return (f"{instruction_id!r}: {name} {value!r} is read as a regular expression by "
                        f"IFEval's checker: {problem}; for the literal text write "
                        f"'{re.escape(value)}'")
    return None


def offline_kinds() -> list[str]:
    """Every instruction id that can be checked on this machine."""
    return [name for name in registry() if missing_data(name) is None]


def _checker(instruction_id: str, kwargs: dict[str, Any]) -> Any:
    checker = registry()[instruction_id](instruction_id)
    checker.build_description(**kwargs)
    return checker


def problem(ids: Any, kwargs: Any) -> tuple[str, str] | None:
    """('instructions' or 'kwargs', why) when the row's instructions cannot be checked."""
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        return "instructions", f"{ids!r} is not a non-empty list of instruction ids"
    if not isinstance(kwargs, list) or len(kwargs) != len(ids):
        return "kwargs", (f"needs a list of {len(ids)} argument objects, one per instruction "
                          f"(got {kwargs!r:.80})")
    for instruction_id, given in zip(ids, kwargs, strict=True):
        if instruction_id not in registry():
            return "instructions", (f"unknown instruction {instruction_id!r}: "
                                    f"{did_you_mean(instruction_id, tuple(registry()))}")
        offline = missing_data(instruction_id)
        if offline is not None:
            return "instructions", offline
        if not isinstance(given, dict):
            return "kwargs", f"arguments of {instruction_id!r} must be an object, got {given!r}"
        given = {k: v for k, v in given.items() if v is not None}
        wanted = arguments(instruction_id)
        missing = [name for name in wanted if name not in given]
        unknown = [name for name in given if name not in wanted]
        if missing or unknown:
            return "kwargs", (f"{instruction_id!r} takes {wanted or 'no arguments'}"
                              + (f"; missing {missing} (the checker would draw them at random)"
                                 if missing else "") + (f"; unknown {unknown}" if unknown else ""))
        try:
            _checker(instruction_id, given)
        except (ValueError, TypeError, KeyError) as exc:
            return "kwargs", f"{instruction_id!r}: {exc}"
        pattern = regex_argument_problem(instruction_id, given)
        if pattern is not None:
            return "kwargs", pattern
    return None


def followed(response: str, ids: list[str], kwargs: list[dict[str, Any]]) -> list[bool]:
    """Per instruction: does the response follow it (strict)? The row must pass `problem`."""
    from if_verifiable.common import evaluate_instructions

    cleaned = [{k: v for k, v in given.items() if v is not None} for given in kwargs]
    results, _ = evaluate_instructions(response=response, instruction_id_list=ids,
                                       kwargs_list=cleaned, prompt="",
                                       instruction_registry=registry())
    if not results:  # nothing left to judge: an empty answer, or only a thinking trace
        return [False] * len(ids)
    if [r.instruction_id for r in results] != ids:
        raise MeasurementError(f"if-verifiable checked {[r.instruction_id for r in results]} "
                               f"of the instructions {ids}")
    return [r.strict_pass for r in results]
