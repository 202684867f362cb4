"""The load's prompts: random token ids (default), or prompts replayed from an eval set or a file.

Replayed prompts keep their real length distribution: each is tokenized once with the served
model's own tokenizer and sent as token ids, so every request's prompt length is known exactly
(the samples record it) and every stage gets the very same tokens. The locustfile draws them
with each user's seeded generator, so all stages see the same sequence of prompts.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.errors import MeasurementError, SpecError
from infra.yamlfile import read_text
from load.profile import LoadProfile, PromptSource

IDS_FILE = "prompt_ids.jsonl"


@dataclass(frozen=True)
class LoadPrompts:
    """Prompts from a source, as token ids, with where they came from."""

    source: str = ""
    ids: tuple[tuple[int, ...], ...] = ()
    left_out: int = 0
    max_tokens: int = 0

    def describe(self) -> str:
        """'eval set math: 300 prompts of 14-96 tokens (median 35)', for the report and record."""
        lengths = [len(ids) for ids in self.ids]
        text = (f"{self.source}: {len(lengths)} prompts of {min(lengths)}-{max(lengths)} tokens "
                f"(median {statistics.median(lengths):g})")
        if self.left_out:
            text += f"; {self.left_out} longer than prompt_tokens ({self.max_tokens}) left out"
        return text

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(list(ids)) + "\n" for ids in self.ids))
        return path


def describe(profile: LoadProfile, prompts: LoadPrompts | None = None) -> str:
    """Which prompts the load sent, in words."""
    if prompts is not None:
        return prompts.describe()
    return f"random token ids, {profile.prompt_tokens} per prompt"


def _evalset_texts(name: str) -> tuple[str, list[str]]:
    """The prompts the eval set sends (its doc_to_text applied to each row of its data)."""
    import pandas as pd

    from evalsets.runner import load_task_config
    from evalsets.spec import EvalSetSpec

    config = load_task_config(EvalSetSpec(name=name))
    files = config.get("dataset_kwargs", {}).get("data_files")
    split = config.get("test_split", "test")
    data = Path(files[split] if isinstance(files, dict) else files)
    rows = pd.read_json(data, lines=True, dtype=False) if data.suffix == ".jsonl" else (
        pd.read_parquet(data) if data.suffix == ".parquet" else pd.read_csv(data, dtype=str))
    template = config["doc_to_text"]
    if callable(template):
        render = template
    else:
        from lm_eval.utils import apply_template

        def render(doc: dict) -> str:
            return apply_template(template, doc)

    return f"eval set {name}", [str(render(row)) for row in rows.to_dict("records")]


def _file_texts(path: Path, field: str) -> tuple[str, list[str]]:
    """JSONL (one object a line with `field`) or plain text (one prompt a line); blank lines
    are skipped; a bad line is named by file, line and field."""
    lines = read_text(path).splitlines()
    texts = []
    jsonl = path.suffix in (".jsonl", ".json") or next(
        (line.lstrip().startswith("{") for line in lines if line.strip()), False)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if not jsonl:
            texts.append(line)
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise SpecError(f"{path}:{number}: not a JSON object ({err.msg})") from err
        value = row.get(field) if isinstance(row, dict) else None
        if not isinstance(value, str) or not value.strip():
            raise SpecError(f"{path}:{number}: field {field!r} is missing or not a non-empty "
                            "string (load profile prompts.field names it)")
        texts.append(value)
    if not texts:
        raise SpecError(f"{path}: holds no prompts")
    return f"file {path.name}", texts


def read_texts(source: PromptSource) -> tuple[str, list[str]]:
    """(where from, the prompt texts) of a source that is not random."""
    if source.source == "evalset":
        return _evalset_texts(str(source.name))
    if source.source == "file":
        return _file_texts(Path(str(source.path)), source.field)
    raise ValueError(f"random prompts have no texts (source {source.source})")


def encoder(checkpoint: Path) -> Callable[[str], list[int]]:
    """Text -> token ids with the checkpoint's tokenizer, special tokens as the server adds them
    to a text prompt."""
    tokenizer_json = checkpoint / "tokenizer.json"
    if tokenizer_json.is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_json))
        return lambda text: tokenizer.encode(text).ids
    from transformers import AutoTokenizer

    try:
        auto = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    except (OSError, ValueError) as err:
        raise MeasurementError(f"load prompts: cannot load a tokenizer from {checkpoint}: {err}") from err
    return lambda text: list(auto(text)["input_ids"])


def prepare(profile: LoadProfile, checkpoint: Path) -> LoadPrompts | None:
    """The profile's prompts tokenized for `checkpoint`; None for random prompts. Prompts longer
    than prompt_tokens are left out (and counted); none left is a SpecError."""
    source = profile.prompts
    if source.source == "random":
        return None
    where, texts = read_texts(source)
    encode = encoder(checkpoint)
    encoded = [tuple(encode(text)) for text in texts]
    kept = tuple(ids for ids in encoded if 0 < len(ids) <= profile.prompt_tokens)
    if not kept:
        raise SpecError(f"load profile prompts ({where}): none of {len(texts)} prompts is 1 to "
                        f"{profile.prompt_tokens} tokens (prompt_tokens) long; raise prompt_tokens")
    return LoadPrompts(source=where, ids=kept, left_out=len(encoded) - len(kept),
                       max_tokens=profile.prompt_tokens)


def sized(profile: LoadProfile, prompts: LoadPrompts | None) -> LoadProfile:
    """The profile with prompt_tokens set to the mean prompt the load sent (the random token
    after the first included): what a model of uniform requests (the capacity what-if) must be
    given, since prompt_tokens is only the longest replayed prompt."""
    if prompts is None:
        return profile
    mean = statistics.fmean(len(ids) + 1 for ids in prompts.ids)
    return profile.model_copy(update={"prompt_tokens": max(1, round(mean))})


def bind(profile: LoadProfile, prompts: LoadPrompts | None, folder: Path) -> LoadProfile:
    """The profile with its prompts' token ids saved in `folder` for the locustfile to replay."""
    if prompts is None:
        return profile
    return profile.with_prompt_ids(prompts.save(folder / IDS_FILE))


def source_digest(source: PromptSource) -> str | None:
    """sha256 of what a source's prompts are read from (for the stage cache key and the record):
    the file's bytes, or the eval set's task config and data; None for random prompts."""
    if source.source == "random":
        return None
    if source.source == "file":
        paths = [Path(str(source.path))]
    else:
        from evalsets.spec import get_evalset

        folder = get_evalset(str(source.name)).folder
        paths = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".jsonl", ".csv",
                                                                     ".parquet", ".py"))
    digest = hashlib.sha256()
    for path in paths:
        try:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        except OSError as err:
            raise SpecError(f"{path}: load profile prompts cannot be read: {err.strerror or err}") from err
    return digest.hexdigest()
