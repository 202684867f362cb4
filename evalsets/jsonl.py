"""JSON Lines, the format every eval set's data ships in."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    """One JSON object per line; generators use it so data files stay byte-for-byte repeatable."""
    with path.open("w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    return path


def read_jsonl(path: Path) -> list[dict]:
    """Every row of a JSON Lines file; a bad line is a SpecError naming the file and line."""
    rows = []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if raw.strip():
            rows.append(parse_row(path, number, raw))
    return rows


def parse_row(path: Path, number: int, raw: bytes) -> dict:
    """One line of a JSON Lines file as an object; not UTF-8, not JSON, not an object, a key
    given twice (json would keep the last silently) or NaN / Infinity (not JSON, and a number
    no answer can be judged against) are SpecErrors naming the file and line."""
    from infra.errors import SpecError

    try:
        row = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys,
                         parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}:{number}: not UTF-8 text ({exc.reason})") from exc
    except _BadRow as exc:
        raise SpecError(f"{path}:{number}: {exc}") from exc
    except RecursionError as exc:  # json recurses per level: '[[[[...' thousands deep
        raise SpecError(f"{path}:{number}: nested too deeply to read; flatten the row") from exc
    except ValueError as exc:
        raise SpecError(f"{path}:{number}: not JSON: {exc}") from exc
    if not isinstance(row, dict):
        raise SpecError(f"{path}:{number}: a JSON {type(row).__name__}, not an object")
    return row


class _BadRow(ValueError):
    """A line that parses as Python's json but is not data quantgate can judge."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    row: dict = {}
    for key, value in pairs:
        if key in row:
            raise _BadRow(f"key {key!r} is given twice in one object (JSON would keep the "
                          "second silently); keep one")
        row[key] = value
    return row


def _no_constant(name: str) -> float:
    raise _BadRow(f"{name} is not a JSON number; write a finite number")
