"""Were two stages asked the same way? Chat template, tokenizer, generation settings, items, load.

The flow records what each stage was served and sent (`Comparability`, in the stage record) when
it is measured; the gates compare every stage with the baseline before judging it
(gates/comparability_check.py). A difference is a failed rule naming the field: a quantized stage
judged on other prompts, another template or a shorter generation budget says nothing about the
quantization.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

# What lm-eval's API models send when the task leaves a setting out (max_gen_toks: the runner's).
GENERATION_DEFAULTS: dict[str, Any] = {"max_gen_toks": 256, "until": None, "temperature": 0.0,
                                       "do_sample": False}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt",
                   "spiece.model")
NOT_APPLIED = "not applied (plain completions)"
HASH_CHARS = 16


class SetSettings(BaseModel):
    """How one eval set was asked."""

    generation: dict[str, Any] = Field(
        default_factory=dict, description="max_gen_toks, until, temperature, do_sample (and any "
        "other generation setting of the task), as sent.")
    items: int = Field(description="Items scored in the first look; adaptive looks add more on "
                       "both sides, so only the first look must match.")


class Comparability(BaseModel):
    """What a stage was served and sent, as the comparability rule compares it."""

    chat_template: str = Field(description="sha256 of the chat template text the server applied, "
                               f"or '{NOT_APPLIED}'.")
    tokenizer: str = Field(description="sha256 of the checkpoint's tokenizer files.")
    sets: dict[str, SetSettings] = Field(default_factory=dict)
    load_profile: str = Field(description="sha256 of the resolved load profile and its prompts.")
    load_prompts: str = Field(default="random token ids", description="Where the load's prompts "
                              "came from, in words.")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:HASH_CHARS]


def chat_template_hash(checkpoint: Path, applied: bool = True) -> str:
    """The template the server applies: chat_template.jinja, else tokenizer_config.json's
    `chat_template` (transformers reads them in that order; vLLM uses the tokenizer's)."""
    if not applied:
        return NOT_APPLIED
    jinja = checkpoint / "chat_template.jinja"
    if jinja.is_file():
        return _sha(jinja.read_bytes())
    config = checkpoint / "tokenizer_config.json"
    template = None
    if config.is_file():
        try:
            template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        except (ValueError, AttributeError):
            template = None
    if template is None:
        return "none (the checkpoint ships no chat template)"
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return _sha(text.encode())


def tokenizer_hash(checkpoint: Path) -> str:
    """One digest over the tokenizer files the checkpoint ships (name and content)."""
    digest = hashlib.sha256()
    found = False
    for name in TOKENIZER_FILES:
        path = checkpoint / name
        if path.is_file():
            found = True
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:HASH_CHARS] if found else "none (no tokenizer files)"


def generation_settings(task_config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a generate_until task sends, from its lm-eval config (defaults filled in)."""
    given = dict(task_config.get("generation_kwargs") or {})
    settings = {key: given.pop(key, default) for key, default in GENERATION_DEFAULTS.items()}
    if isinstance(settings["until"], str):
        settings["until"] = [settings["until"]]
    return settings | given


def profile_hash(profile: Mapping[str, Any], prompts_digest: str | None = None) -> str:
    """The resolved load profile (and the content of its prompt source, when it has one)."""
    text = json.dumps({"profile": profile, "prompts": prompts_digest}, sort_keys=True, default=str)
    return _sha(text.encode())


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


def recorded_differences(mine: Comparability, theirs: Comparability) -> list[str]:
    """Every recorded field that differs, named, with both values."""
    out = []
    for field, label in (("chat_template", "chat template"), ("tokenizer", "tokenizer")):
        a, b = getattr(mine, field), getattr(theirs, field)
        if a != b:
            out.append(f"{label} {a} vs baseline {b}")
    for name, settings in mine.sets.items():
        base = theirs.sets.get(name)
        if base is None:
            continue  # named by id_differences from the items themselves
        for key in sorted(set(settings.generation) | set(base.generation)):
            a, b = settings.generation.get(key), base.generation.get(key)
            if a != b:
                out.append(f"set {name} {key} {_shown(a)} vs baseline {_shown(b)}")
        if settings.items != base.items:
            out.append(f"set {name} first-look items {settings.items} vs baseline {base.items}")
    if mine.load_profile != theirs.load_profile:
        out.append(f"load profile {mine.load_profile} ({mine.load_prompts}) vs baseline "
                   f"{theirs.load_profile} ({theirs.load_prompts})")
    return out
