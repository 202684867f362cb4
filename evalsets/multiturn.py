"""Multi-turn dialogues through lm-eval: one prompt string that carries every turn.

lm-eval hands a task's `doc_to_text` to the model as one user message. A dialogue is encoded into
that string (`encode_dialogue`) and the chat model in evalsets/runner.py expands it back into its
separate messages (`expand_messages`) before sending, so the server applies the chat template per
turn, as in a real conversation, instead of to one flattened string.
"""

from __future__ import annotations

import json
from typing import Any

from infra.errors import SpecError

# Starts every encoded dialogue; no real prompt begins with it.
MARKER = "<|quantgate-dialogue|>"
ROLES = ("system", "user", "assistant")


def check_dialogue(messages: Any, where: str = "dialogue") -> list[dict[str, str]]:
    """The messages as plain {role, content} dicts; SpecError naming `where` and the turn if not
    a non-empty list of known roles with text, ending with the user's turn."""
    if not isinstance(messages, list) or not messages:
        raise SpecError(f"{where}: messages must be a non-empty list of {{role, content}} turns")
    turns = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise SpecError(f"{where}: turn {index}: expected an object with role and content, "
                            f"got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise SpecError(f"{where}: turn {index}: role {role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(content, str) or not content.strip():
            raise SpecError(f"{where}: turn {index} ({role}): content must be non-empty text")
        turns.append({"role": role, "content": content})
    if turns[-1]["role"] != "user":
        raise SpecError(f"{where}: the last turn must be the user's (the model answers it), "
                        f"not {turns[-1]['role']!r}")
    return turns


def encode_dialogue(messages: list[dict]) -> str:
    """One string holding every turn; `decode_dialogue` gives the same messages back."""
    return MARKER + json.dumps(check_dialogue(messages), ensure_ascii=False)


def decode_dialogue(text: object) -> list[dict] | None:
    """The messages of an encoded dialogue; None for any other text (an ordinary prompt)."""
    if not isinstance(text, str) or not text.startswith(MARKER):
        return None
    try:
        return check_dialogue(json.loads(text[len(MARKER):]))
    except (ValueError, SpecError):
        return None


def expand_messages(messages: list[dict]) -> list[dict]:
    """A chat request's messages with every encoded dialogue replaced by its own turns."""
    expanded: list[dict] = []
    for message in messages:
        turns = decode_dialogue(message.get("content"))
        expanded += turns if turns is not None else [message]
    return expanded


def is_multiturn(config: dict[str, Any]) -> bool:
    """Whether a set's task config (task.yaml) declares multi-turn items (`metadata.multiturn`)."""
    return bool((config.get("metadata") or {}).get("multiturn"))
