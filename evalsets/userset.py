"""A user's own data file as an eval set: rows read with their line numbers, the data contract
they imply, and the lm-eval task config built in memory around the declared scorer.

The rows reach lm-eval through `custom_dataset` as `{"id": str, "row": JSON text}` documents:
every column keeps its own type per row (a reference that is a label in one row and an object
in the next would not load as an Arrow column), and ids are strings, as items pair by str(id).
"""

from __future__ import annotations

import csv
import io
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from evalsets.scorers import ChoiceScorer
from evalsets.spec import EvalSetInfo
from infra.errors import SpecError

LINE = "__line"
MESSAGES = "messages"
DEFAULT_PROMPT = "prompt"
DEFAULT_MAX_GEN_TOKS = 256
# The stop strings of the built-in sets (ChatML and end of text).
STOP = ["<|im_end|>", "<|endoftext|>"]


def _utf8(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecError(f"{path}:{line}: not UTF-8 text ({exc.reason})") from exc


def _jsonl(path: Path, raw: bytes) -> list[dict]:
    rows = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError(f"{path}:{number}: not UTF-8 text ({exc.reason})") from exc
        try:
            row = json.loads(text)
        except ValueError as exc:
            raise SpecError(f"{path}:{number}: not JSON: {exc}") from exc
        if not isinstance(row, dict):
            raise SpecError(f"{path}:{number}: a JSON {type(row).__name__}, not an object")
        rows.append(row | {LINE: number})
    return rows


def _csv(path: Path, raw: bytes) -> list[dict]:
    reader = csv.DictReader(io.StringIO(_utf8(path, raw), newline=""))
    rows = []
    try:
        for row in reader:
            if None in row:
                raise SpecError(f"{path}:{reader.line_num}: more values than the header has "
                                f"columns ({len(reader.fieldnames or [])})")
            rows.append({k: ("" if v is None else v) for k, v in row.items()} | {LINE: reader.line_num})
    except csv.Error as exc:
        raise SpecError(f"{path}:{reader.line_num}: cannot parse CSV: {exc}") from exc
    return rows


def _parquet(path: Path) -> list[dict]:
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path}: cannot read Parquet: {exc}".replace("\n", " ")) from exc
    # Through JSON: numpy scalars and arrays become plain numbers and lists.
    rows = json.loads(frame.to_json(orient="records", force_ascii=False))
    return [row | {LINE: number} for number, row in enumerate(rows, start=1)]


@lru_cache(maxsize=32)
def _cached_rows(path: Path, size: int, mtime_ns: int) -> tuple[dict, ...]:
    raw = path.read_bytes()
    if path.suffix == ".jsonl":
        return tuple(_jsonl(path, raw))
    if path.suffix == ".csv":
        return tuple(_csv(path, raw))
    if path.suffix == ".parquet":
        return tuple(_parquet(path))
    raise SpecError(f"{path}: unsupported data format {path.suffix!r} (valid: .jsonl, .csv, .parquet)")


def read_rows(path: Path) -> list[dict]:
    """Every row of a data file as a dict, with its 1-based line (`__line`; a CSV counts its
    header, a Parquet row counts from 1); a bad line is a SpecError naming file and line."""
    if not path.is_file():
        raise SpecError(f"{path}: data file not found")
    stat = path.stat()
    return [dict(row) for row in _cached_rows(path.resolve(), stat.st_size, stat.st_mtime_ns)]


def prompt_field(info: EvalSetInfo) -> str:
    """The declared prompt field; by default 'prompt', or 'messages' when the file has a
    messages column and no prompt column (a dialogue per row)."""
    if info.prompt_field:
        return info.prompt_field
    columns = {key for row in read_rows(info.data_file)[:100] for key in row}
    return MESSAGES if MESSAGES in columns and DEFAULT_PROMPT not in columns else DEFAULT_PROMPT


def is_dialogue(info: EvalSetInfo) -> bool:
    return prompt_field(info) == MESSAGES


def prompt_text(info: EvalSetInfo, row: dict[str, Any], field: str | None = None) -> str:
    """What lm-eval sends for the row: the prompt, or the encoded dialogue of its messages."""
    field = field or prompt_field(info)
    if field == MESSAGES:
        from evalsets.multiturn import encode_dialogue

        messages = row[field]
        return encode_dialogue(json.loads(messages) if isinstance(messages, str) else messages)
    return str(row[field])


def readable_prompt(info: EvalSetInfo, row: dict[str, Any], field: str | None = None) -> str:
    """The prompt as a person reads it (a dialogue's turns one per paragraph): for the report
    and for counting tokens."""
    field = field or prompt_field(info)
    if field != MESSAGES:
        return str(row[field])
    messages = row[field]
    messages = json.loads(messages) if isinstance(messages, str) else messages
    return "\n\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages)


def contract(info: EvalSetInfo) -> Any:
    """The data contract a user data file implies: id, prompt and the scorer's fields."""
    from evalsets.contracts import Contract

    return Contract(id=info.id_field, prompt=[prompt_field(info)], reference=info.scorer.fields)


def check_rows(info: EvalSetInfo, rows: list[dict]) -> None:
    """What the scorer needs of each row beyond presence (a number, a schema, a list of
    choices, a dialogue ending with the user's turn); SpecError names file, line and field."""
    field = prompt_field(info)
    for row in rows:
        where = f"{info.data_file}:{row[LINE]}"
        ident = f"id {str(row.get(info.id_field))!r}"
        if field == MESSAGES:
            try:
                prompt_text(info, row, field)
            except (SpecError, ValueError) as exc:
                raise SpecError(f"{where}: field {MESSAGES!r} ({ident}): "
                                f"{str(exc).removeprefix('dialogue: ')}") from exc
        problem = info.scorer.problem(row)
        if problem is not None:
            raise SpecError(f"{where}: field {problem[0]!r} ({ident}): {problem[1]}")


def task_yaml(info: EvalSetInfo) -> dict[str, Any]:
    """The set as a task.yaml would declare it (no callables): what validation reads."""
    choice = isinstance(info.scorer, ChoiceScorer)
    metric = "acc" if choice else "score"
    return {
        "task": f"qg_user_{info.name}",
        "dataset_kwargs": {"data_files": {"test": str(info.data_file)}},
        "test_split": "test",
        "output_type": "multiple_choice" if choice else "generate_until",
        "generation_kwargs": {"until": list(STOP), "do_sample": False, "temperature": 0.0,
                              "max_gen_toks": DEFAULT_MAX_GEN_TOKS},
        "metric_list": [{"metric": metric, "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0, "primary_metric": metric, "multiturn": is_dialogue(info),
                     "scorer": info.scorer.kind},
    }


def _documents(info: EvalSetInfo) -> Any:
    import datasets

    rows = read_rows(info.data_file)
    docs = [{"id": str(row[info.id_field]),
             "row": json.dumps({k: v for k, v in row.items() if k != LINE}, ensure_ascii=False)}
            for row in rows]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def task_config(info: EvalSetInfo) -> dict[str, Any]:
    """The lm-eval task config of a user data file, built in memory."""
    config = task_yaml(info)
    field, scorer = prompt_field(info), info.scorer

    def row_of(doc: dict) -> dict:
        return json.loads(doc["row"])

    config["custom_dataset"] = lambda **_: _documents(info)
    config["doc_to_text"] = lambda doc: prompt_text(info, row_of(doc), field)
    config["num_fewshot"] = 0
    if isinstance(scorer, ChoiceScorer):
        config["doc_to_choice"] = lambda doc: scorer.choices(row_of(doc))
        config["doc_to_target"] = lambda doc: scorer.gold(row_of(doc))
        config["target_delimiter"] = " "
        return config
    config["doc_to_target"] = lambda doc: scorer.reference(row_of(doc))
    config["target_delimiter"] = " "
    config["process_results"] = lambda doc, results: {"score": scorer.score(results[0], row_of(doc))}
    return config


def data_digest(path: Path) -> str:
    """A user set's content: its data file, or every file of its folder (task.yaml, data,
    grading code), by relative path and bytes. It lies outside evalsets/, so the stage cache
    key takes it from here: changing one row changes the key."""
    from infra.digest import folder_digest

    if path.is_dir():
        return folder_digest(path)
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def chat_template_problem(sets: list[Any], chat_template: bool) -> str | None:
    """Why the sets cannot run as the spec asks, or None: a choice set scores the log-likelihood
    of each choice, which lm-eval's chat model cannot do (LocalChatCompletion.loglikelihood
    raises NotImplementedError): it needs the completions endpoint."""
    if not chat_template:
        return None
    for spec in sets:
        if spec.path is not None and isinstance(spec.scorer, ChoiceScorer):
            return (f"evalsets: {spec.name!r} has a choice scorer (log-likelihood of each choice), "
                    "which the chat endpoint cannot score; set chat_template: false or use "
                    "another scorer")
    return None
