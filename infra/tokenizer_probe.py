"""A tokenizer.json loaded and tried in a child process, as the engine will load it: the tokenizers
library is Rust, and a file it cannot handle can make it panic (a BaseException that no `except
Exception` stops, with a Rust backtrace on stderr), abort or spin; here that is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 60
# Words, digits, punctuation, accents, CJK, a chat marker and a line break: what prompts hold.
PROBE = "Hello, world! 1234 café naïve 漢字 <|im_start|>user\nWhat is 2+2?"
_CHILD = """
import json, sys
try:
    from tokenizers import Tokenizer
except ImportError:
    print(json.dumps({"skipped": "the tokenizers library is not installed"}))
    raise SystemExit(0)
step = "load"
try:
    tokenizer = Tokenizer.from_file(sys.argv[1])
    step = "encode"
    ids = tokenizer.encode(sys.argv[2]).ids
    tokenizer.decode(ids)
except BaseException as err:  # a PanicException is a BaseException
    print(json.dumps({"step": step, "kind": type(err).__name__, "error": str(err)}))
else:
    print(json.dumps({"tokens": len(ids)}))
"""


def tokenizer_problem(path: Path) -> str | None:
    """Why the tokenizers library cannot load `path` and encode a line of text with it, as the
    rest of a sentence that starts with the path (the library's own words), or None; None too
    where the library is not installed ("skipped")."""
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, str(path), PROBE],
                              capture_output=True, text=True, timeout=TIMEOUT_S,
                              env=os.environ | {"RUST_BACKTRACE": "0"})
    except subprocess.TimeoutExpired:
        return f"does not load as a tokenizer within {TIMEOUT_S} s (the tokenizers library spins)"
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return (f"does not load as a tokenizer (the tokenizers library crashed, exit code "
                f"{done.returncode})")
    if "error" in answer:
        error = " ".join(str(answer["error"]).split())[:200]
        if answer.get("kind") == "PanicException":
            error = f"the tokenizers library panicked: {error}"
        if answer.get("step") == "load":
            return f"does not load as a tokenizer ({error})"
        return f"loads, but cannot encode a line of text ({error})"
    if answer.get("tokens") == 0:
        return "encodes a line of text to no tokens at all (an empty vocabulary)"
    return None
