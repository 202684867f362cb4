"""Structured output: eval items that declare a JSON Schema, asked with the engine's guided
decoding (the OpenAI-compatible `response_format` field vLLM reads), for a structured_output
stage. Schema validity itself is the set's own scorer (business/grading.py `score_json`)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from evalsets.schema_refs import local_refs_problem
from infra.errors import MeasurementError
from infra.secrets import auth_headers

# The probe a structured_output stage sends before its eval sets: a one-key object.
PROBE_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                "additionalProperties": False}


def item_schema(doc: dict[str, Any]) -> dict | None:
    """The JSON Schema an item declares (a `schema` field, JSON text or an object, on a row
    scored as json or without a scorer field); None when it declares none."""
    schema = doc.get("schema")
    if not schema or doc.get("scorer", "json") != "json":
        return None
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise MeasurementError(f"item {doc.get('id')!r}: schema is not JSON text: {exc}") from exc
    problem = local_refs_problem(schema)
    if problem is not None:
        raise MeasurementError(f"item {doc.get('id')!r}: schema {problem}")
    return schema if isinstance(schema, dict) else None


def response_format(name: str, schema: dict) -> dict:
    """The OpenAI-compatible structured-output field vLLM's guided decoding reads."""
    return {"type": "json_schema",
            "json_schema": {"name": re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64], "schema": schema}}


def structured_formats(config: dict[str, Any], info: Any = None) -> dict[str, dict]:
    """Prompt text -> response_format for every item of the task that declares a JSON Schema:
    a built-in row's `schema` field (item_schema), or a user data file's json scorer's schema
    (`info.scorer.schema_of`, evalsets/userset.py rows travel as JSON text in `row`)."""
    import datasets
    from lm_eval.utils import apply_template

    split = config.get("test_split", "test")
    if callable(config.get("custom_dataset")):
        rows = config["custom_dataset"]()[split]
    else:
        rows = datasets.load_dataset(config["dataset_path"], **(config.get("dataset_kwargs") or {}))[split]
    schema_of = getattr(getattr(info, "scorer", None), "schema_of", None)
    if getattr(info, "data_file", None) is not None:
        def declared(doc: dict) -> dict | None:
            return schema_of(json.loads(doc["row"])) if schema_of is not None else None
    else:
        declared = item_schema
    doc_to_text = config["doc_to_text"]
    formats = {}
    for doc in rows:
        schema = declared(doc)
        if schema is None:
            continue
        prompt = doc_to_text(doc) if callable(doc_to_text) else apply_template(doc_to_text, doc)
        formats[prompt] = response_format(f"item_{doc.get('id', len(formats))}", schema)
    return formats


def check_guided_decoding(base_url: str, model: str, chat: bool, timeout_s: float = 120) -> None:
    """Fail closed, in one line, when the server refuses or ignores `response_format`: one short
    request whose answer must be JSON valid under PROBE_SCHEMA."""
    root = base_url.rstrip("/")
    body: dict[str, Any] = {"model": model, "max_tokens": 48, "temperature": 0,
                            "response_format": response_format("quantgate_probe", PROBE_SCHEMA)}
    question = 'Is the sky blue? Answer in JSON: {"ok": true} or {"ok": false}.'
    if chat:
        url, body["messages"] = f"{root}/v1/chat/completions", [{"role": "user", "content": question}]
    else:
        url, body["prompt"] = f"{root}/v1/completions", question
    try:
        response = httpx.post(url, json=body, timeout=timeout_s, headers=auth_headers())
    except httpx.HTTPError as exc:
        raise MeasurementError(f"structured output: {url} did not answer: {exc!r}") from exc
    if response.status_code != 200:
        raise MeasurementError(
            f"structured output: the engine at {root} refused guided decoding (response_format "
            f"json_schema): HTTP {response.status_code}: {response.text[:300]}")
    choice = (response.json().get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
    try:
        answer = json.loads(text or "")
    except ValueError:
        answer = None
    if not (isinstance(answer, dict) and isinstance(answer.get("ok"), bool) and len(answer) == 1):
        raise MeasurementError(
            f"structured output: the engine at {root} accepted response_format but its answer "
            f"{(text or '')[:120]!r} is not valid under the schema; guided decoding is not applied")


def schema_items(spec: Any) -> int:
    """How many of the items a spec selects (its groups, its first `limit`) declare a JSON
    Schema, read from the set's data without an engine."""
    from evalsets.contracts import data_files, load_contract
    from evalsets.jsonl import read_jsonl

    info = spec.info
    if info.data_file is not None:  # a user data file: its json scorer gives every row one
        return 1 if getattr(info.scorer, "schema_of", None) is not None else 0
    rows = [row for path in data_files(info) if path.suffix == ".jsonl" and path.is_file()
            for row in read_jsonl(path)]
    if spec.groups is not None:
        group = load_contract(info).group
        rows = [row for row in rows if str(row.get(group)) in spec.groups]
    return sum(item_schema(row) is not None for row in rows[:spec.limit])


def check_schema_items(stage_name: str, sets: list[Any]) -> None:
    """A structured_output stage needs items that declare a schema: without any, its quality
    would measure nothing guided decoding changes (fail closed, before any engine starts)."""
    if not any(schema_items(spec) for spec in sets):
        from infra.errors import SpecError

        raise SpecError(
            f"stage {stage_name!r} is structured_output but none of the eval sets "
            f"({', '.join(spec.name for spec in sets)}) declares a JSON Schema; add the business "
            "set or a user set with a json scorer")
