"""Tiny local copies of lm-eval tasks' datasets, in the formats their own configs read."""

from __future__ import annotations

import json
from pathlib import Path


def write_splits(folder: Path, rows: list[dict], splits: tuple[str, ...]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split in splits:
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def gsm8k(folder: Path, n: int = 8) -> Path:
    """GSM8K's fields (question; answer ending in '#### N'), its test and train splits: the
    question 'What is i plus i?' has the answer 2i."""
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"{i} plus {i} is {2 * i}.\n#### {2 * i}"}
            for i in range(1, n + 1)]
    return write_splits(folder, rows, ("test", "train"))


def arc_easy(folder: Path) -> Path:
    """ARC's fields (question, choices {text, label}, answerKey), its three splits."""
    rows = [{"id": "lost", "question": "Ticket : lost parcel", "answerKey": "B",
             "choices": {"text": ["billing", "shipping"], "label": ["A", "B"]}},
            {"id": "double", "question": "Ticket : double charge", "answerKey": "A",
             "choices": {"text": ["billing", "shipping"], "label": ["A", "B"]}}]
    return write_splits(folder, rows, ("test", "validation", "train"))


def gsm8k_repository(folder: Path, n: int = 30) -> Path:
    """A copy of GSM8K's Hub repository as `git clone` leaves it: Parquet shards per config,
    the README's `configs` saying which files are which split."""
    import pandas as pd

    (folder / "main").mkdir(parents=True)
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"} for i in range(1, n + 1)]
    for split in ("train", "test"):
        pd.DataFrame(rows).to_parquet(folder / "main" / f"{split}-00000-of-00001.parquet")
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n"
        "    path: main/train-*\n  - split: test\n    path: main/test-*\n---\n# gsm8k\n")
    return folder
