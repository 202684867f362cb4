"""Grading for the conversation set: each row names its scorer, one hook dispatches.

- `exact`: the whole answer, trimmed of quotes, emphasis and a final period, equals the
  reference case-insensitively (a city, a product).
- `contains`: the reference appears in the answer (an order number, a name, a date).
- `numeric`: the declared or last number in the answer equals the reference (a quantity, a sum).

The scorers are the business and math sets' own, so a dialogue is graded like a single prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from evalsets.business.grading import score_contains, score_exact
from evalsets.jsonl import read_jsonl
from evalsets.math.grading import is_correct
from evalsets.multiturn import check_dialogue, encode_dialogue
from infra.errors import SpecError

SCORERS: tuple[str, ...] = ("exact", "contains", "numeric")


class DialogueItem(BaseModel):
    """One row of a conversation JSONL file."""

    model_config = {"extra": "ignore"}

    id: str = Field(description="Unique, stable id: items pair across stages by it.")
    messages: list[dict] = Field(description="The turns, ending with the user's question.")
    scorer: Literal["exact", "contains", "numeric"] = Field(description="How the answer is scored.")
    reference: str = Field(min_length=1, description="The expected answer (text or number).")
    group: str | None = Field(default=None, description="recall or combine.")

    @field_validator("messages")
    @classmethod
    def _turns(cls, messages: list[dict]) -> list[dict]:
        try:
            return check_dialogue(messages, "messages")
        except SpecError as err:
            raise ValueError(str(err)) from err


SCORE: dict[str, Callable[[str, str], bool]] = {
    "exact": score_exact,
    "contains": score_contains,
    "numeric": is_correct,
}


def load_items(path: Path) -> list[DialogueItem]:
    """Validate a conversation JSONL file; the error names the line and the field."""
    items = []
    for number, row in enumerate(read_jsonl(path), start=1):
        try:
            items.append(DialogueItem.model_validate(row))
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"]) or "row"
            raise SpecError(f"{path}:{number}: {where}: {error['msg']} "
                            f"(scorers: {', '.join(SCORERS)})") from exc
    return items


def doc_to_text(doc: dict) -> str:
    """lm-eval hook: the dialogue as one string that the chat model expands into its turns."""
    return encode_dialogue(doc["messages"])


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """lm-eval hook: one response per doc in, the primary metric out; a malformed row raises."""
    try:
        item = DialogueItem.model_validate({k: v for k, v in doc.items() if v is not None})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise SpecError(f"conversation item {doc.get('id')!r}: {where}: {error['msg']}") from exc
    return {"score": float(SCORE[item.scorer](results[0], item.reference))}
