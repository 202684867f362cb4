"""Were two stages asked the same way? Chat template, tokenizer, generation settings, items, load.

The flow records what each stage was served and sent (`Comparability`, in the stage record) when
it is measured; the gates compare every stage with the baseline before judging it. A difference
is a failed rule naming the field: a quantized stage judged on other prompts, another template or
a shorter generation budget says nothing about the quantization.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from gates.verdict import Check

if TYPE_CHECKING:  # the record holds a Comparability: imported for types only
    from gates.record import StageRecord

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


def _first_difference(mine: list[str], theirs: list[str]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)


def id_differences(stage: StageRecord, baseline: StageRecord) -> list[str]:
    """Item ids per set, from the stored items: the stage's items must be the baseline's, in the
    same order, over the items both scored (the baseline may hold more: a later stage's adaptive
    looks grew it); a stage with items the baseline never scored is not paired on them."""
    if stage.quality is None or baseline.quality is None:
        return []
    out = []
    for name, task in stage.quality.tasks.items():
        theirs = baseline.quality.tasks.get(name)
        if theirs is None:
            out.append(f"set {name} was not measured on the baseline")
            continue
        mine_ids, their_ids = [i.id for i in task.items], [i.id for i in theirs.items]
        at = _first_difference(mine_ids, their_ids)
        if at is not None:
            out.append(f"set {name} item ids differ from the baseline's at item {at + 1} "
                       f"({mine_ids[at]!r} vs {their_ids[at]!r})")
        elif len(mine_ids) > len(their_ids):
            out.append(f"set {name} {len(mine_ids)} items vs baseline {len(their_ids)} (items the "
                       "baseline never scored)")
    for name in baseline.quality.tasks:
        if name not in stage.quality.tasks:
            out.append(f"set {name} was not measured on the stage (baseline has it)")
    return out


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


def comparability_check(stage: StageRecord, baseline: StageRecord) -> Check:
    """Fails closed on any difference from the baseline. A record stored before quantgate kept
    what it served has only its item ids checked, and says so."""
    differences = id_differences(stage, baseline)
    mine, theirs = stage.comparability, baseline.comparability
    if mine is not None and theirs is not None:
        differences = recorded_differences(mine, theirs) + differences
    if differences:
        return Check(rule="comparability", passed=False, reason="; ".join(differences),
                     details={"differences": len(differences)})
    if mine is None or theirs is None:
        missing = " and ".join(name for name, record in (("the stage", mine), ("the baseline", theirs))
                               if record is None)
        return Check(rule="comparability", passed=True, applicable=False,
                     reason=f"item ids match; chat template, tokenizer, generation settings and "
                     f"load profile not recorded for {missing} (stored by an older quantgate): "
                     "re-run the acceptance to check them")
    return Check(rule="comparability", passed=True,
                 reason=f"as the baseline: chat template {mine.chat_template}, tokenizer "
                 f"{mine.tokenizer}, generation settings and items of {len(mine.sets)} set(s), "
                 f"load profile {mine.load_profile} ({mine.load_prompts})")
