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
    from infra.errors import SpecError

    rows = []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise SpecError(f"{path}:{number}: not UTF-8 text ({exc.reason})") from exc
        except ValueError as exc:
            raise SpecError(f"{path}:{number}: not JSON: {exc}") from exc
        if not isinstance(row, dict):
            raise SpecError(f"{path}:{number}: a JSON {type(row).__name__}, not an object")
        rows.append(row)
    return rows
