"""Generators of the built-in eval sets' data: `python -m tools.generators.SET` rewrites
evalsets/SET/data.jsonl."""

from __future__ import annotations

from pathlib import Path

import evalsets


def set_folder(name: str) -> Path:
    """The folder of the built-in eval set `name`, where its generator writes."""
    return Path(evalsets.__file__).resolve().parent / name
