"""Reading a checkpoint's JSON files: plain JSON of a sane depth, or one line naming the file and field."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from infra.errors import CheckpointError

# Model configs, tokenizer configs, indexes and safetensors headers are a few levels deep; a deeper
# file is not one of them, and walking it would exhaust Python's recursion limit further on.
MAX_DEPTH = 64
# The largest tokenizer.json of a released model is a few tens of MB; a file past this bound is not
# a model file, and reading it whole would only fill the memory.
MAX_BYTES = 256 * 2**20


def field_path(parts: list[str | int]) -> str:
    """`quantization_config.config_groups.group_0` for ['quantization_config', ...]; [i] for items."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(the top level)"


def shown_value(value: Any) -> str:
    """A value as it reads in the JSON file (cut at 60 characters), and its JSON type."""
    if value is None:
        return "null"
    text = json.dumps(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number")
    return f"{text} ({kind})"


def json_problem(value: Any, max_depth: int = MAX_DEPTH) -> str | None:
    """What makes a parsed JSON value unfit to be read further (NaN, Infinity, too deep), or None."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        item, parts = stack.pop()
        if len(parts) > max_depth:
            return (f"nests deeper than {max_depth} levels (at {field_path(parts[:3])}...): no "
                    "model or tokenizer file is that deep; write it again from the model's own")
        if isinstance(item, float) and not math.isfinite(item):
            written = "NaN" if math.isnan(item) else ("Infinity" if item > 0 else "-Infinity")
            return (f"{field_path(parts)} is {written}, which JSON does not allow; write a number "
                    "(or remove the field)")
        if isinstance(item, dict):
            stack.extend((child, [*parts, str(key)]) for key, child in item.items())
        elif isinstance(item, list):
            stack.extend((child, [*parts, index]) for index, child in enumerate(item))
    return None


def parse_json(text: str | bytes, where: str) -> Any:
    """Parse JSON text read from `where` (a file, or a part of one); CheckpointError on anything
    a strict reader would refuse."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{where} is not valid JSON: {err}") from err
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{where} is not UTF-8 text: {err.reason}") from err
    except RecursionError as err:
        raise CheckpointError(f"{where} is not a model file: it nests deeper than Python's JSON "
                              "reader can follow; write it again from the model's own") from err
    except ValueError as err:  # an integer of more digits than Python converts
        raise CheckpointError(f"{where} is not a model file: it holds an integer of more than "
                              f"{sys.get_int_max_str_digits():,} digits; write it again from the "
                              "model's own") from err
    problem = json_problem(value)
    if problem:
        raise CheckpointError(f"{where}: {problem}")
    return value


def check_size(path: Path, fix: str) -> None:
    """Refuse, before reading it, a JSON file larger than any model's (`fix`: what to do)."""
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise CheckpointError(f"{path} is {size:,} bytes, more than any model's JSON file "
                              f"({MAX_BYTES:,} at most); {fix}")


def read_json(path: Path) -> Any:
    """A checkpoint's JSON file, parsed; CheckpointError naming the file when it cannot be."""
    try:
        check_size(path, "copy it again from the model it came from")
        data = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"{path} cannot be read: {err.strerror or err}") from err
    if not data.strip():
        raise CheckpointError(f"{path} is empty ({len(data)} bytes); copy it again from the "
                              "model it came from")
    return parse_json(data, str(path))
