"""Scorers of user eval sets: how one response is judged against one data row.

A user data file declares its scorer in the spec (`scorer: {kind: numeric, field: answer}`); each
kind is a pydantic model with its own arguments (which row fields it reads) and one pure scoring
function. `choice` is scored by lm-eval itself (log-likelihood of each choice); its model only
names the fields and picks the gold index.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import re
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evalsets.business.grading import score_json as _business_score_json
from evalsets.code.grading import extract_code
from evalsets.code_tests import (
    CONVENTIONS,
    TESTS_STYLES,
    CodeTask,
    UnusableTests,
    build_task,
    detect_style,
    prove,
)
from evalsets.patterns import check_schema, regex_problem, schema_patterns_problem, score_regex
from evalsets.schema_refs import local_refs_problem
from infra.errors import did_you_mean
from infra.values import at_most

# Quotes, markdown emphasis and trailing punctuation a model wraps a short answer in.
_WRAPPING = " \t\r\n\"'`*_"
_TRAILING = ".,;:!?。"
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")


def normalize(text: str) -> str:
    """Case, whitespace, wrapping quotes/emphasis and trailing punctuation do not count."""
    text = " ".join(str(text).split()).casefold()
    previous = None
    while previous != text:
        previous = text
        text = text.strip(_WRAPPING).rstrip(_TRAILING)
    return text


def score_exact(response: str, reference: str) -> bool:
    return normalize(response) == normalize(reference)


def last_number(text: str) -> float | None:
    """The last number written in the text (thousands separators allowed), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def score_numeric(response: str, reference: float, tolerance: float = 0.0,
                  relative: float = 0.0) -> bool:
    """The response's last number is within `tolerance` (absolute) or `relative` x |reference|."""
    answer = last_number(response)
    if answer is None or not math.isfinite(answer) or not math.isfinite(reference):
        return False  # an infinite reference would be "within" any tolerance of every answer
    return abs(answer - reference) <= max(tolerance, relative * abs(reference))


def score_json(response: str, schema: dict, expected: dict | None = None) -> bool:
    """The first JSON object in the response is valid under the schema and every field of
    `expected` matches (strings case-insensitively, numbers numerically)."""
    return _business_score_json(response, json.dumps(expected or {}), json.dumps(schema))


def score_code(response: str, tests: Any, entry_point: str, prefix: str = "",
               tests_style: str = "auto", setup: Any = "") -> bool:
    """The code in the response passes the tests in the sandbox: plain asserts, HumanEval's
    check(candidate) (called on `entry_point`, the answer continuing `prefix`, HumanEval's
    prompt) or MBPP's list of asserts; see evalsets.code_tests."""
    task = build_task(tests, entry_point, tests_style, setup, prefix)
    return task.run(extract_code(response, entry_point)).passed


def as_json(value: Any) -> Any:
    """A row value that holds JSON: an object as is (JSONL, Parquet) or JSON text (CSV)."""
    return json.loads(value) if isinstance(value, str) else value


class _Scorer(BaseModel):
    # An infinite tolerance scores every answer right; .nan scores every answer wrong.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    @property
    def fields(self) -> list[str]:
        """Row fields the scorer reads: the data contract requires them in every row."""
        raise NotImplementedError

    def score(self, response: str, row: dict[str, Any]) -> float:
        raise NotImplementedError

    def reference(self, row: dict[str, Any]) -> str:
        """What lm-eval logs as the item's target."""
        return str(row.get(self.fields[0], "")) if self.fields else ""

    def problem(self, row: dict[str, Any]) -> tuple[str, str] | None:
        """(field, why) when the scorer cannot use this row (checked before any engine starts)."""
        return None

    def rows_problem(self, rows: list[dict[str, Any]]) -> tuple[dict[str, Any], str, str] | None:
        """(row, field, why) of the first row a check of all rows at once finds unusable (the
        code scorer runs each row's tests against a stub and a reference); after `problem`."""
        return None


class ExactScorer(_Scorer):
    """Exact match after normalisation (case, whitespace, wrapping quotes, final punctuation)."""

    kind: Literal["exact"]
    field: str = Field(default="answer", description="Row field with the expected answer.")

    @property
    def fields(self) -> list[str]:
        return [self.field]

    def score(self, response: str, row: dict[str, Any]) -> float:
        return float(score_exact(response, str(row[self.field])))


class RegexScorer(_Scorer):
    """The response matches a pattern: one for every row, or each row's own (`field`)."""

    kind: Literal["regex"]
    pattern: str | None = Field(default=None, description="Python regular expression, searched.")
    field: str | None = Field(default=None, description="Row field with the row's own pattern.")

    @model_validator(mode="after")
    def _one_pattern(self) -> RegexScorer:
        if (self.pattern is None) == (self.field is None):
            raise ValueError("a regex scorer takes exactly one of 'pattern' (every row) or "
                             "'field' (the row field that holds each row's pattern)")
        problem = None if self.pattern is None else regex_problem(self.pattern)
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def fields(self) -> list[str]:
        return [self.field] if self.field else []

    def score(self, response: str, row: dict[str, Any]) -> float:
        return float(score_regex(response, self.pattern or str(row[self.field])))

    def problem(self, row: dict[str, Any]) -> tuple[str, str] | None:
        if self.field is None:
            return None
        problem = regex_problem(str(row[self.field]))
        return None if problem is None else (self.field, problem)


class NumericScorer(_Scorer):
    """The last number in the response is within a tolerance of the row's reference number."""

    kind: Literal["numeric"]
    field: str = Field(default="answer", description="Row field with the reference number.")
    tolerance: float = Field(default=0.0, ge=0, description="Absolute tolerance.")
    relative: Annotated[float, at_most(1, "", "above 1 an answer of the wrong sign scores "
                                      "right")] = Field(
        default=0.0, ge=0, description="Relative tolerance (0.01 = 1 %), at most 1.")

    @property
    def fields(self) -> list[str]:
        return [self.field]

    def score(self, response: str, row: dict[str, Any]) -> float:
        reference = float(str(row[self.field]).replace(",", ""))
        return float(score_numeric(response, reference, self.tolerance, self.relative))

    def problem(self, row: dict[str, Any]) -> tuple[str, str] | None:
        try:
            reference = float(str(row[self.field]).replace(",", ""))
        except ValueError:
            return self.field, f"{row[self.field]!r} is not a number"
        if not math.isfinite(reference):
            return self.field, (f"{row[self.field]!r} is not a finite number: every answer would "
                                "be within tolerance of it (or none); give the reference number")
        return None

    def rows_problem(self, rows: list[dict[str, Any]]) -> tuple[dict[str, Any], str, str] | None:
        """A tolerance so wide that one answer, the same for every row, scores them all right
        (0 at relative 1, the middle of the references at a huge absolute one): the set would
        measure nothing. A set of one reference value is left alone (nothing to tell apart)."""
        references = [float(str(row[self.field]).replace(",", "")) for row in rows]
        if len(set(references)) < 2:
            return None
        for answer in (0.0, (min(references) + max(references)) / 2):
            if all(abs(answer - ref) <= max(self.tolerance, self.relative * abs(ref))
                   for ref in references):
                return rows[0], self.field, (
                    f"scorer tolerance {self.tolerance:g} / relative {self.relative:g}: the one "
                    f"answer {answer:g} would score every row right, so the set measures nothing; "
                    "give a tolerance smaller than half the spread of the references")
        return None


class JsonScorer(_Scorer):
    """The answer's first JSON object is valid under a JSON Schema (one for the set, or each
    row's own) and, with `field`, matches every key of the row's reference object."""

    kind: Literal["json"]
    schema_: dict | None = Field(default=None, alias="schema", description="JSON Schema, inline.")
    schema_field: str | None = Field(default=None, description="Row field with the row's schema.")
    field: str | None = Field(default=None, description="Row field with the expected object.")

    @model_validator(mode="after")
    def _a_schema(self) -> JsonScorer:
        from jsonschema.exceptions import SchemaError

        if (self.schema_ is None) == (self.schema_field is None):
            raise ValueError("a json scorer takes exactly one of 'schema' (every row) or "
                             "'schema_field' (the row field that holds each row's schema)")
        if self.schema_ is not None:
            try:
                check_schema(self.schema_)
            except SchemaError as exc:
                raise ValueError(f"'schema' is not a valid JSON Schema: {exc.message}") from exc
            problem = local_refs_problem(self.schema_) or schema_patterns_problem(self.schema_)
            if problem is not None:
                raise ValueError(f"'schema': {problem}")
        return self

    @property
    def fields(self) -> list[str]:
        return [name for name in (self.field, self.schema_field) if name]

    def schema_of(self, row: dict[str, Any]) -> dict:
        return self.schema_ if self.schema_ is not None else as_json(row[self.schema_field])

    def score(self, response: str, row: dict[str, Any]) -> float:
        expected = as_json(row[self.field]) if self.field else None
        return float(score_json(response, self.schema_of(row), expected))

    def problem(self, row: dict[str, Any]) -> tuple[str, str] | None:
        from jsonschema.exceptions import SchemaError
        from jsonschema.validators import validator_for

        where = self.schema_field or "schema"
        try:
            schema = self.schema_of(row)
            check_schema(schema)
        except ValueError as exc:
            return where, f"not JSON text: {exc}"
        except (SchemaError, TypeError, AttributeError) as exc:
            return where, f"not a valid JSON Schema: {getattr(exc, 'message', exc)}"
        refs = local_refs_problem(schema) or schema_patterns_problem(schema)
        if refs is not None:
            return where, refs
        if self.field is None:
            return None
        try:
            expected = as_json(row[self.field])
        except ValueError as exc:
            return self.field, f"not JSON text: {exc}"
        if not isinstance(expected, dict):
            return self.field, "the reference must be a JSON object"
        errors = [error.message for error in validator_for(schema)(schema).iter_errors(expected)]
        return (self.field, f"the reference fails the schema: {errors[0]}") if errors else None


class CodeScorer(_Scorer):
    """The code in the answer passes the row's unit tests in the sandbox: plain asserts,
    HumanEval's `check(candidate)` (run as check(<entry point>) after the tests) or MBPP's
    `test_list`. At validate every row's tests must fail a stub of the entry point and pass the
    row's reference solution, where it has one."""

    kind: Literal["code"]
    tests_field: str = Field(default="tests", description="Row field with the tests.")
    tests_style: Literal["auto", "asserts", "humaneval", "mbpp"] = Field(
        default="auto", description="How the tests are run: 'asserts' as they are, 'humaneval' "
                                    "then check(<entry point>), 'mbpp' a list of asserts; "
                                    "'auto' tells each row's from its tests.")
    entry_point_field: str | None = Field(
        default="entry_point", description="Row field with the function name the tests call; "
                                           "null: the first function they call (MBPP).")
    prefix_field: str | None = Field(
        default=None, description="Row field with the code the answer continues (signature and "
                                  "docstring); default: 'prompt' for HumanEval tests.")
    setup_field: str | None = Field(
        default=None, description="Row field with code run before the tests; default: MBPP's "
                                  "test_setup_code or test_imports.")
    reference_field: str | None = Field(
        default=None, description="Row field with a solution that must pass the tests at "
                                  "validate; default: canonical_solution (MBPP: code) where a "
                                  "row has one.")

    @field_validator("tests_style", mode="before")
    @classmethod
    def _known_style(cls, value: Any) -> Any:
        if value not in TESTS_STYLES:
            raise ValueError(f"tests_style {value!r}: {did_you_mean(str(value), TESTS_STYLES)}")
        return value

    @property
    def fields(self) -> list[str]:
        named = [self.entry_point_field, self.prefix_field, self.reference_field]
        return [self.tests_field, *[name for name in named if name]]

    def _style(self, row: dict[str, Any]) -> str:
        return detect_style(row[self.tests_field]) if self.tests_style == "auto" else self.tests_style

    def _source(self, row: dict[str, Any], part: str) -> tuple[str | None, Any]:
        """(field, value) of a part ('prefix', 'setup', 'reference'): the field the spec names,
        else the first of its convention's fields the row fills, else (None, '')."""
        named = {"prefix": self.prefix_field, "setup": self.setup_field,
                 "reference": self.reference_field}[part]
        if named:
            return named, row[named]
        defaults = getattr(CONVENTIONS[self._style(row)], part)
        return next(((name, row[name]) for name in defaults
                     if row.get(name) is not None and str(row[name]).strip()), (None, ""))

    def task(self, row: dict[str, Any]) -> CodeTask:
        """The row's tests in runnable form; UnusableTests says why they cannot run."""
        entry_point = str(row[self.entry_point_field]).strip() if self.entry_point_field else None
        return build_task(row[self.tests_field], entry_point, self._style(row),
                          self._source(row, "setup")[1], str(self._source(row, "prefix")[1]))

    def score(self, response: str, row: dict[str, Any]) -> float:
        task = self.task(row)
        return float(task.run(extract_code(response, task.entry_point)).passed)

    def _field(self, row: dict[str, Any], part: str) -> str:
        """The row field a part of the tests came from, for the error line."""
        if part == "entry_point" and self.entry_point_field:
            return self.entry_point_field
        if part in ("prefix", "setup", "reference"):
            return self._source(row, part)[0] or self.tests_field
        return self.tests_field

    def problem(self, row: dict[str, Any]) -> tuple[str, str] | None:
        try:
            self.task(row)
        except UnusableTests as exc:
            return self._field(row, exc.part), str(exc)
        return None

    def rows_problem(self, rows: list[dict[str, Any]]) -> tuple[dict[str, Any], str, str] | None:
        references = [self._source(row, "reference") for row in rows]
        found = prove([self.task(row) for row in rows],
                      [str(code) if field else None for field, code in references])
        if found is None:
            return None
        row = rows[found.index]
        return row, self._field(row, found.part), found.why


class ChoiceScorer(_Scorer):
    """Multiple choice by log-likelihood (lm-eval scores it): the choice the model finds most
    likely must be the row's answer, given as its 0-based index or its text."""

    kind: Literal["choice"]
    choices_field: str = Field(default="choices", description="Row field with the choices (a list).")
    field: str = Field(default="answer", description="Row field with the right choice.")

    @property
    def fields(self) -> list[str]:
        return [self.field, self.choices_field]

    def choices(self, row: dict[str, Any]) -> list[str]:
        choices = as_json(row[self.choices_field])
        if not isinstance(choices, list) or len(choices) < 2:
            raise ValueError(f"'{self.choices_field}' must be a list of at least two choices")
        return [str(choice) for choice in choices]

    def gold(self, row: dict[str, Any]) -> int:
        """The right choice's index: an integer index, or the text of one of the choices."""
        choices, answer = self.choices(row), row[self.field]
        if isinstance(answer, str) and answer in choices:  # the text wins over a digit string
            return choices.index(answer)
        as_index = isinstance(answer, int) and not isinstance(answer, bool) or \
            isinstance(answer, str) and answer.strip().isdigit()
        if as_index and 0 <= int(answer) < len(choices):
            return int(answer)
        raise ValueError(f"'{self.field}' {answer!r} is neither an index of the {len(choices)} "
                         "choices nor one of them")

    def reference(self, row: dict[str, Any]) -> str:
        return str(self.gold(row))

    def problem(self, row: dict[str, Any]) -> tuple[str, str] | None:
        try:
            self.choices(row)
        except ValueError as exc:
            return self.choices_field, str(exc)
        try:
            self.gold(row)
        except ValueError as exc:
            return self.field, str(exc)
        return None


class InstructionsScorer(_Scorer):
    """IFEval's verifiable instructions (PyPI's if-verifiable): the response must follow every
    instruction the row lists, in strict mode (prompt-level strict accuracy). Unknown ids,
    missing arguments and instructions whose checker needs data not installed here are refused
    at validate (evalsets.instruction_checks)."""

    kind: Literal["instructions"]
    instructions_field: str = Field(default="instruction_id_list",
                                    description="Row field with the instruction ids (a list).")
    kwargs_field: str = Field(default="kwargs", description="Row field with one arguments "
                                                           "object per instruction (a list).")

    @property
    def fields(self) -> list[str]:
        return [self.instructions_field, self.kwargs_field]

    def _parts(self, row: dict[str, Any]) -> tuple[Any, Any]:
        return as_json(row[self.instructions_field]), as_json(row[self.kwargs_field])

    def _unreadable(self, row: dict[str, Any]) -> tuple[str, str] | None:
        for field in self.fields:
            try:
                as_json(row[field])
            except ValueError as exc:
                return field, f"not JSON text: {exc}"
        return None

    def reference(self, row: dict[str, Any]) -> str:
        return ", ".join(map(str, as_json(row[self.instructions_field])))

    def score(self, response: str, row: dict[str, Any]) -> float:
        from evalsets.instruction_checks import followed

        return float(all(followed(response, *self._parts(row))))

    def problem(self, row: dict[str, Any]) -> tuple[str, str] | None:
        from evalsets import instruction_checks

        unreadable = self._unreadable(row)
        if unreadable is not None:
            return unreadable
        found = instruction_checks.problem(*self._parts(row))
        if found is None:
            return None
        part, why = found
        return (self.instructions_field if part == "instructions" else self.kwargs_field), why


# The registry: a new kind is a class here, and every list of kinds (the spec's discriminated
# union, `new-evalset --scorer`, the messages that name the choices) is read from it.
SCORERS: tuple[type[_Scorer], ...] = (ExactScorer, RegexScorer, NumericScorer, JsonScorer,
                                      CodeScorer, ChoiceScorer, InstructionsScorer)
SCORER_KINDS: tuple[str, ...] = tuple(get_args(cls.model_fields["kind"].annotation)[0]
                                      for cls in SCORERS)
Scorer = Annotated[functools.reduce(operator.or_, SCORERS), Field(discriminator="kind")]
