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

from evalsets.jsonl import parse_row
from evalsets.scorers import ChoiceScorer
from evalsets.spec import EvalSetInfo
from infra.errors import MeasurementError, SpecError

LINE = "__line"
MESSAGES = "messages"
DEFAULT_PROMPT = "prompt"
DEFAULT_MAX_GEN_TOKS = 256
CHOICE_TOKENS = 32
# The stop strings of the built-in sets (ChatML and end of text).
STOP = ["<|im_end|>", "<|endoftext|>"]


def _utf8(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecError(f"{path}:{line}: not UTF-8 text ({exc.reason})") from exc


def _jsonl(path: Path, raw: bytes) -> list[dict]:
    return [parse_row(path, number, line) | {LINE: number}
            for number, line in enumerate(raw.splitlines(), start=1) if line.strip()]


def _csv(path: Path, raw: bytes) -> list[dict]:
    reader = csv.DictReader(io.StringIO(_utf8(path, raw), newline=""))
    rows = []
    try:
        columns = reader.fieldnames or []
        twice = next((name for name in columns if columns.count(name) > 1), None)
        if twice is not None:
            raise SpecError(f"{path}:1: column {twice!r} is given twice in the header (each row "
                            "would keep the second silently); keep one")
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
    if not isinstance(messages, list):
        return str(messages)
    return "\n\n".join(f"{m.get('role')}: {m.get('content')}" if isinstance(m, dict) else str(m)
                       for m in messages)


def _row_error(info: EvalSetInfo, row: dict, field: str, why: str) -> SpecError:
    return SpecError(f"{info.data_file}:{row[LINE]}: field {field!r} "
                     f"(id {str(row.get(info.id_field))!r}): {why}")


def check_rows(info: EvalSetInfo, rows: list[dict]) -> None:
    """What the scorer needs of each row beyond presence (a number, a schema, a list of
    choices, a dialogue ending with the user's turn, code tests that fail a stub and pass the
    reference); SpecError names file, line and field."""
    field = prompt_field(info)
    for row in rows:
        if field == MESSAGES:
            try:
                prompt_text(info, row, field)
            except (SpecError, ValueError) as exc:
                raise _row_error(info, row, MESSAGES,
                                 str(exc).removeprefix("dialogue: ")) from exc
        problem = info.scorer.problem(row)
        if problem is not None:
            raise _row_error(info, row, *problem)
    found = info.scorer.rows_problem(rows)
    if found is not None:
        raise _row_error(info, *found)


def task_yaml(info: EvalSetInfo) -> dict[str, Any]:
    """The set as a task.yaml would declare it (no callables): what validation reads."""
    choice = isinstance(info.scorer, ChoiceScorer)
    metric = "acc" if choice else "score"
    return {
        "task": f"qg_user_{info.name}",
        "dataset_kwargs": {"data_files": {"test": str(info.data_file)}},
        "test_split": "test",
        "output_type": "multiple_choice" if choice else "generate_until",
        # A choice set generates nothing: its budget bounds a choice's tokens for the fit check.
        "generation_kwargs": {"until": list(STOP), "do_sample": False, "temperature": 0.0,
                              "max_gen_toks": CHOICE_TOKENS if choice else DEFAULT_MAX_GEN_TOKS},
        "metric_list": [{"metric": metric, "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0, "primary_metric": metric, "multiturn": is_dialogue(info),
                     "scorer": info.scorer.kind},
    }


def _documents(info: EvalSetInfo) -> Any:
    import datasets

    rows = read_rows(info.data_file)
    labels = [field for field in (info.group_field, info.cluster_field) if field]
    docs = [{"id": str(row[info.id_field]),
             "row": json.dumps({k: v for k, v in row.items() if k != LINE}, ensure_ascii=False)}
            | {field: str(row[field]) for field in labels}  # read into QualityItem by the runner
            for row in rows]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def _no_metadata_hint(record: Any) -> bool:
    """lm-eval suggests `--metadata` for every custom dataset; quantgate has no such option."""
    return "Custom kwargs can be passed to `--metadata`" not in str(record.msg)


def task_config(info: EvalSetInfo) -> dict[str, Any]:
    """The lm-eval task config of a user data file, built in memory."""
    import logging

    task_log = logging.getLogger("lm_eval.api.task")
    if _no_metadata_hint not in task_log.filters:
        task_log.addFilter(_no_metadata_hint)
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
    config["process_results"] = lambda doc, results: {"score": _score(info, row_of(doc), results[0])}
    return config


def _score(info: EvalSetInfo, row: dict, response: str) -> float:
    """The scorer's score of one answer; a score it cannot give (a pattern's search past its
    time bound) fails the measurement in one line naming the item, never a hang."""
    try:
        return info.scorer.score(response, row)
    except MeasurementError as exc:
        raise MeasurementError(f"{info.data_file}: item {str(row.get(info.id_field))!r}: "
                               f"{exc}") from exc


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


# Example rows per scorer kind: a few templates, expanded reproducibly to EXAMPLE_ROWS rows so a
# spec with the scaffold as is has enough items for the accuracy gate's power (validate checks).
EXAMPLE_ROWS = 120
_TEAMS = {
    "billing": ["I was charged twice for order {n}.", "My invoice {n} shows the wrong amount.",
                "Please refund the duplicate payment on order {n}."],
    "shipping": ["Parcel {n} has not arrived after ten days.", "Order {n} was sent to my old "
                 "address.", "The tracking page for parcel {n} has not moved in a week."],
    "account": ["I cannot log in to account {n} since I changed my e-mail.", "Please delete "
                "account {n} and its data.", "The password reset link for account {n} expired."],
}
_ROUTE = "Route the ticket to billing, shipping or account. Answer with the team only.\n\nTicket: "
_NAMES = ["Ana Silva", "Ben Okafor", "Chen Wei", "Dara Novak", "Eli Haddad", "Femi Adeyemi"]


# (what the prompt asks, IFEval's instruction id, its arguments): checked offline, no NLTK data.
INSTRUCTIONS = [
    ("Reply to the customer in at most 50 words.", "length_constraints:number_words",
     {"num_words": 50, "relation": "less than"}),
    ("Reply to the customer without using any commas.", "punctuation:no_comma", {}),
    ("Reply to the customer in lowercase letters only.", "change_case:english_lowercase", {}),
    ("Reply to the customer and mention the word 'ticket'.", "keywords:existence",
     {"keywords": ["ticket"]}),
]


def _tickets() -> list[tuple[str, str]]:
    tickets = [(team, text.format(n=1000 + 37 * i))
               for i in range(EXAMPLE_ROWS // 9 + 1)
               for team, texts in _TEAMS.items() for text in texts]
    return tickets[:EXAMPLE_ROWS]


def examples(kind: str) -> tuple[dict, list[dict]]:
    """The scorer declaration and the example rows of one scorer kind."""
    import random

    rng = random.Random(12)
    rows: list[dict] = []
    if kind == "exact":
        rows = [{"id": f"t{i:03d}", "prompt": _ROUTE + text, "answer": team}
                for i, (team, text) in enumerate(_tickets())]
        return {"kind": "exact", "field": "answer"}, rows
    if kind == "instructions":
        rows = [{"id": f"i{i:03d}", "prompt": f"{text} {INSTRUCTIONS[i % len(INSTRUCTIONS)][0]}",
                 "instruction_id_list": [INSTRUCTIONS[i % len(INSTRUCTIONS)][1]],
                 "kwargs": [INSTRUCTIONS[i % len(INSTRUCTIONS)][2]]}
                for i, (_, text) in enumerate(_tickets())]
        return {"kind": "instructions", "instructions_field": "instruction_id_list",
                "kwargs_field": "kwargs"}, rows
    if kind == "choice":
        rows = [{"id": f"q{i:03d}", "prompt": f"Ticket: {text}\nQuestion: which team handles it?"
                 "\nAnswer:", "choices": list(_TEAMS), "answer": team}
                for i, (team, text) in enumerate(_tickets())]
        return {"kind": "choice", "choices_field": "choices", "field": "answer"}, rows
    for i in range(EXAMPLE_ROWS):
        a, b = rng.randint(2, 12), rng.randint(2, 40)
        if kind == "regex":
            year, month, day = 2020 + i % 6, 1 + i % 12, 1 + i % 28
            rows.append({"id": f"r{i:03d}", "prompt": f"Write the date {day}/{month}/{year} "
                         "(day/month/year) in ISO format, YYYY-MM-DD.",
                         "pattern": rf"\b{year}-{month:02d}-{day:02d}\b"})
        elif kind == "numeric":
            rows.append({"id": f"n{i:03d}", "prompt": f"An order has {a} items at {b}.50 each. "
                         "What is the total? Answer with the number only.",
                         "answer": a * (b + 0.5)})
        elif kind == "json":
            name, amount = _NAMES[i % len(_NAMES)], a * b + 0.5
            rows.append({"id": f"j{i:03d}", "prompt": "Extract the customer and the amount as "
                         "JSON with keys customer (string) and amount (number).\n\nText: "
                         f"{name} paid {amount} euros for order {1000 + i}.",
                         "schema": {"type": "object", "required": ["customer", "amount"],
                                    "properties": {"customer": {"type": "string"},
                                                   "amount": {"type": "number"}}},
                         "answer": {"customer": name, "amount": amount}})
        elif kind == "code":
            op, sign, at_a, at_zero = [("plus", "+", a + 5, 5), ("times", "*", a * 5, 0),
                                       ("minus", "-", a - 5, -5)][i % 3]
            rows.append({"id": f"c{i:03d}", "prompt": f"Write a Python function {op}_{i}(x) that "
                         f"returns x {sign} 5.", "entry_point": f"{op}_{i}",
                         "tests": f"assert {op}_{i}({a}) == {at_a}\nassert {op}_{i}(0) == {at_zero}"})
    scorers = {"regex": {"kind": "regex", "field": "pattern"},
               "numeric": {"kind": "numeric", "field": "answer", "tolerance": 0.01},
               "json": {"kind": "json", "schema_field": "schema", "field": "answer"},
               "code": {"kind": "code", "tests_field": "tests", "entry_point_field": "entry_point"}}
    if kind not in scorers:
        raise SpecError(f"no examples for scorer kind {kind!r}")
    return scorers[kind], rows


def scaffold(folder: Path, kind: str, source: Path | None = None) -> list[Path]:
    """A new user set in `folder`: a data file (example rows for the scorer, or the rows of
    `source`), a README and a spec snippet; refuses a folder that holds anything."""
    import shutil

    import yaml

    from evalsets.scorers import SCORER_KINDS
    from evalsets.spec import DATA_SUFFIXES, registry
    from infra.errors import did_you_mean

    if kind not in SCORER_KINDS:
        raise SpecError(f"--scorer {kind!r}: {did_you_mean(kind, SCORER_KINDS)}")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise SpecError(f"{folder} already exists and is not empty; choose a new folder")
    scorer, rows = examples(kind)
    if source is not None:
        if source.suffix not in DATA_SUFFIXES:
            raise SpecError(f"--from {source}: unsupported data file (valid: {', '.join(DATA_SUFFIXES)})")
        read_rows(source)  # a bad line fails here, named, before anything is written
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / (source.name if source is not None else "data.jsonl")
    if source is not None:
        shutil.copyfile(source, data)
    else:
        data.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in folder.resolve().name.lower())
    name = name.lstrip("_-") or "own_set"
    name = f"{name}_own" if name in registry() else name
    entry = {"name": name, "path": str(data.resolve()), "scorer": scorer, "limit": 50}
    snippet = folder / "spec-snippet.yaml"
    endpoint = ("\n# choice scores log-likelihoods: the spec needs chat_template: false\n"
                "chat_template: false\n" if kind == "choice" else "")
    snippet.write_text("# Paste under `evalsets:` in your candidate spec (a relative path is "
                       "relative to the spec file).\n" + yaml.safe_dump({"evalsets": [entry]},
                                                                         sort_keys=False) + endpoint)
    readme = folder / "README.md"
    readme.write_text(f"""# Eval set `{name}` ({kind} scorer)

`{data.name}` holds one item per row: a unique `id`, the `prompt` sent to the model (or a
`messages` list of {{role, content}} turns ending with the user's, for a dialogue), and the
fields the `{kind}` scorer reads: {", ".join(_scorer_fields(scorer))}. Add your own rows in the
same shape (JSONL, CSV or Parquet).

Point a candidate spec at it with the entry in `spec-snippet.yaml`, then check it before any
engine starts:

    quantgate validate SPEC.yaml

A bad row is named by file, line and field (exit 2). Other row field names: set
`prompt_field` / `id_field` in the spec entry and the scorer's field names in `scorer`.
""")
    return [data, readme, snippet]


def _scorer_fields(scorer: dict) -> list[str]:
    return [f"`{value}`" for key, value in scorer.items() if key.endswith("field")] or ["-"]


def loglikelihood_model_args(config: dict[str, Any], tokenizer_dir: Path) -> dict[str, Any]:
    """lm-eval model arguments a log-likelihood task (a `choice` set) needs on the completions
    endpoint: the client tokenizes with the model's own tokenizer, so lm-eval knows where the
    context ends (without a tokenizer its `_loglikelihood_tokens` refuses). None needed for
    generation tasks. For the runner to merge into its completions model's arguments."""
    if config.get("output_type") not in ("multiple_choice", "loglikelihood"):
        return {}
    return {"tokenizer_backend": "huggingface", "tokenizer": str(tokenizer_dir),
            "tokenized_requests": True}
