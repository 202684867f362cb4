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
