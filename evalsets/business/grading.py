"""Grading for the business set: each row names its scorer, one hook dispatches.

- `exact`: the whole answer, trimmed of whitespace, quotes, markdown emphasis and a final period,
  equals the reference, case-insensitively (a label from a fixed set).
- `contains`: the reference appears in the answer, case- and whitespace-insensitively (a field
  copied out of a document).
- `json`: the first JSON object in the answer (code fences allowed) parses, is valid under the
  row's JSON Schema, and every field of the reference JSON object matches (strings
  case-insensitively, numbers numerically).

`reference` and `schema` are strings in the JSONL (`schema` holds JSON text, "" when unused):
the json loader lm-eval uses makes one column type per field, so a field that is a label in one
row and an object in the next would not load.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from infra.errors import SpecError

Scorer = Literal["exact", "contains", "json"]
SCORERS: tuple[str, ...] = ("exact", "contains", "json")

_TRIM = " \t\r\n\"'`*_."
_FENCE = re.compile(r"```[A-Za-z]*\n?(.*?)(?:```|\Z)", re.DOTALL)


class BusinessItem(BaseModel):
    """One row of a business JSONL file."""

    id: str = Field(description="Unique, stable id: items pair across stages by it.")
    prompt: str = Field(description="The whole user message sent to the model.")
    scorer: Scorer = Field(description="How the answer is scored: exact, contains or json.")
    reference: str = Field(
        description="exact/contains: the expected text; json: a JSON object of expected fields."
    )
    schema_: str = Field(default="", alias="schema", description="json: the JSON Schema, as JSON text.")
    group: str | None = Field(default=None, description="Optional sub-group for per-group results.")

    model_config = {"extra": "ignore", "populate_by_name": True}

    @model_validator(mode="after")
    def _json_rows_are_complete(self) -> BusinessItem:
        if self.scorer != "json":
            return self
        from jsonschema.exceptions import SchemaError
        from jsonschema.validators import validator_for

        schema = _json_text(self.schema_, "schema", self.id)
        expected = _json_text(self.reference, "reference", self.id)
        if not isinstance(expected, dict):
            raise ValueError(f"item {self.id!r}: a json row's reference must be a JSON object")
        validator = validator_for(schema)
        try:
            validator.check_schema(schema)
        except SchemaError as exc:
            raise ValueError(f"item {self.id!r}: invalid JSON Schema: {exc.message}") from exc
        problems = [error.message for error in validator(schema).iter_errors(expected)]
        if problems:
            raise ValueError(f"item {self.id!r}: the reference fails its own schema: {problems[0]}")
        return self


def _json_text(text: str, field: str, item_id: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"item {item_id!r}: {field} is not JSON text: {exc}") from exc


def load_items(path: Path) -> list[BusinessItem]:
    """Validate a business JSONL file; the error names the line and the field."""
    items = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append(BusinessItem.model_validate_json(line))
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"]) or "row"
            raise SpecError(
                f"{path}:{number}: {where}: {error['msg']} (scorers: {', '.join(SCORERS)})"
            ) from exc
    ids = [item.id for item in items]
    if len(set(ids)) != len(ids):
        raise SpecError(f"{path}: ids are not unique: {sorted({i for i in ids if ids.count(i) > 1})[:5]}")
    return items


def _normalize(text: str) -> str:
    return " ".join(text.split()).casefold()


def score_exact(response: str, reference: str) -> bool:
    return _normalize(response.strip(_TRIM)) == _normalize(reference)


def score_contains(response: str, reference: str) -> bool:
    return _normalize(reference) in _normalize(response)


def first_json_object(response: str) -> Any:
    """The first JSON object in the response, looking inside code fences first; None if none."""
    decoder = json.JSONDecoder()
    for text in [*_FENCE.findall(response), response]:
        for start in [m.start() for m in re.finditer(r"\{", text)]:
            try:
                value, _ = decoder.raw_decode(text, start)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def _same(value: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or isinstance(value, bool):
        return value is expected
    if isinstance(expected, int | float) and isinstance(value, int | float):
        return float(value) == float(expected)
    if isinstance(expected, str) and isinstance(value, str):
        return _normalize(value) == _normalize(expected)
    return value == expected


def score_json(response: str, reference: str, schema: str) -> bool:
    from jsonschema.validators import validator_for

    answer = first_json_object(response)
    if answer is None:
        return False
    schema_object = json.loads(schema)
    if any(True for _ in validator_for(schema_object)(schema_object).iter_errors(answer)):
        return False
    expected = json.loads(reference)
    return all(key in answer and _same(answer[key], value) for key, value in expected.items())


SCORE: dict[str, Callable[[str, BusinessItem], bool]] = {
    "exact": lambda response, item: score_exact(response, item.reference),
    "contains": lambda response, item: score_contains(response, item.reference),
    "json": lambda response, item: score_json(response, item.reference, item.schema_),
}


def score(response: str, item: BusinessItem) -> float:
    return float(SCORE[item.scorer](response, item))


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """lm-eval hook: one response per doc in, the primary metric out. A malformed row raises
    (fail closed) with its id and the field."""
    try:
        item = BusinessItem.model_validate({k: v for k, v in doc.items() if v is not None})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise SpecError(f"business item {doc.get('id')!r}: {where}: {error['msg']}") from exc
    return {"score": score(results[0], item)}
