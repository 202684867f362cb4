"""The structured_output stage: the parent served again, asked with guided decoding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import flows.tasks as tasks
from evalsets.results import QualityResult
from evalsets.runner import run_evalset
from evalsets.spec import EvalSetSpec
from evalsets.structured import (
    PROBE_SCHEMA,
    check_guided_decoding,
    check_schema_items,
    item_schema,
    schema_items,
)
from flows.cache import digest, stage_keys
from flows.plan import LOAD_SCHEMA, plan
from flows.spec import load_spec
from infra.errors import MeasurementError, SpecError
from load.profile import LoadProfile
from load.runner import run_level
from tests.evalsets.chat_fake import FakeChat
from tests.fake_openai import FakeOpenAI
from tests.flows.test_spec import write_spec

STAGES = [
    {"name": "w8", "kind": "weights", "checkpoint": None},
    {"name": "w8-json", "kind": "structured_output"},
]
LOAD = LoadProfile(low_users=1, high_users=1, prompt_tokens=8, output_tokens=4, requests=3,
                   warmup_requests=0, request_timeout_s=10, seed=5)


@pytest.fixture(autouse=True)
def digest_store(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def structured_spec(tmp_path: Path, **extra) -> Path:
    write_spec(tmp_path)  # makes the demo checkpoints under tmp_path/models
    stages = [dict(STAGES[0], checkpoint=str(tmp_path / "models" / "w8a16")), dict(STAGES[1], **extra)]
    return write_spec(tmp_path, stages=stages)


def test_plan_accepts_it_with_no_axis_changed_and_says_what_it_changes(tmp_path):
    stages = plan(load_spec(structured_spec(tmp_path)))
    parent, stage = stages[1], stages[2]
    assert stage.kind == "structured_output" and stage.parent == "w8" and stage.changed == []
    assert stage.axes == parent.axes and stage.checkpoint == parent.checkpoint
    assert stage.engine_flags == parent.engine_flags and stage.fingerprint() == parent.fingerprint()
    assert stage.structured_output and not parent.structured_output
    assert stage.axes.describe(stage.kind).startswith("structured output (guided decoding); ")
    assert parent.request_options == {} and parent.load_body == {}
    fmt = stage.load_body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == LOAD_SCHEMA


@pytest.mark.parametrize("extra", [{"checkpoint": "models/w8a8"},
                                   {"engine_flags": {"kv_cache_dtype": "fp8"}}])
def test_validate_refuses_it_with_a_checkpoint_or_flags(tmp_path, extra):
    with pytest.raises(SpecError, match="w8-json.*structured_output stage: it serves its parent's "
                                        "exact configuration, so it takes no checkpoint"):
        load_spec(structured_spec(tmp_path, **extra))


def test_its_cache_key_differs_from_its_parents(tmp_path):
    spec = load_spec(structured_spec(tmp_path))
    parts = stage_keys(plan(spec), spec, {"requests": 12}, {}, 64)
    keys = {name: digest(p) for name, p in parts.items()}
    assert len(set(keys.values())) == 3
    assert parts["w8-json"]["request_options"]["load"]["response_format"]["type"] == "json_schema"
    assert "request_options" not in parts["w8"]  # every other stage's key is as it was
    # Same serving: without its request options the key would be its parent's, parent for parent.
    same = {k: v for k, v in parts["w8-json"].items() if k not in ("kind", "request_options")}
    assert same | {"parent": parts["w8"]["parent"]} == parts["w8"]


def _business_rows() -> list[dict]:
    data = EvalSetSpec(name="business").info.folder / "data.jsonl"
    return [json.loads(line) for line in data.read_text().splitlines()[:6]]


@pytest.mark.parametrize("structured", [True, False])
def test_schema_items_carry_response_format_and_others_do_not(tmp_path, structured):
    rows = {row["prompt"]: row for row in _business_rows()}
    with FakeChat(answer='{"name": "x", "quantity": 1}') as server:
        run_evalset(server.base_url, server.model, EvalSetSpec(name="business", limit=6), tmp_path,
                    count_tokens=None, num_concurrent=1, structured_output=structured)
        bodies = list(server.requests)
    assert len(bodies) == 6
    with_schema = 0
    for body in bodies:
        row = rows[body["messages"][-1]["content"]]
        if structured and row["scorer"] == "json":
            fmt = body["response_format"]
            assert fmt["type"] == "json_schema"
            assert fmt["json_schema"]["schema"] == json.loads(row["schema"])
            assert fmt["json_schema"]["name"] == f"item_{row['id']}"
            with_schema += 1
        else:
            assert "response_format" not in body, row["id"]
    assert with_schema == (2 if structured else 0)  # biz-0002 and biz-0005 are json items


def test_item_schema_only_for_json_rows():
    assert item_schema({"scorer": "exact", "schema": ""}) is None
    assert item_schema({"scorer": "exact", "schema": '{"type": "object"}'}) is None
    assert item_schema({"scorer": "json", "schema": '{"type": "object"}'}) == {"type": "object"}
    assert item_schema({"schema": {"type": "array"}}) == {"type": "array"}
    with pytest.raises(MeasurementError, match="'b1': schema is not JSON"):
        item_schema({"id": "b1", "scorer": "json", "schema": "{nope"})


def test_guided_decoding_probe_fails_closed():
    with FakeChat(answer='{"ok": true}') as good:
        check_guided_decoding(good.base_url, good.model, chat=True)
        assert good.requests[0]["response_format"]["json_schema"]["schema"] == PROBE_SCHEMA
    with FakeChat(answer="Yes, it is blue.") as ignoring, \
            pytest.raises(MeasurementError, match="not valid under the schema; guided decoding is "
                                                  "not applied"):
        check_guided_decoding(ignoring.base_url, ignoring.model, chat=True)
    with FakeOpenAI() as no_chat, pytest.raises(MeasurementError, match="refused guided decoding.*"
                                                                        "HTTP 404"):
        check_guided_decoding(no_chat.base_url, no_chat.model, chat=True)


def test_every_load_request_of_the_stage_carries_the_schema(tmp_path):
    body = {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "quantgate_load", "schema": LOAD_SCHEMA}}}
    with FakeOpenAI() as server:
        samples = run_level(server.base_url, "fake-model", LOAD, "low", 1, tmp_path / "s",
                            request_body=body)
        plain = run_level(server.base_url, "fake-model", LOAD, "low", 1, tmp_path / "p")
        requests = list(server.requests)
    assert len(samples) == len(plain) == 3 and all(s.error is None for s in samples + plain)
    assert [r.get("response_format") for r in requests] == [body["response_format"]] * 3 + [None] * 3
    assert all(r["ignore_eos"] and r["max_tokens"] == 4 for r in requests)  # equal work kept


def test_only_the_stage_side_of_paired_rounds_adds_the_fields(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(tasks, "run_paired_load",
                        lambda stage, reference, *args, **kwargs: seen.update(
                            stage=stage, reference=reference) or (None, None))
    facts = type("Facts", (), {"base_url": "http://s", "model": "m", "command_line": lambda s: "",
                           "pid": None})
    body = {"response_format": {"type": "json_schema"}}
    tasks.measure_paired_load.fn(facts(), facts(), plan(load_spec(structured_spec(tmp_path)))[1],
                                      LOAD, tmp_path, None, body)
    assert seen["stage"].request_body == body and seen["reference"].request_body is None


def test_a_user_json_set_carries_its_scorers_schema(tmp_path):
    schema = {"type": "object", "properties": {"priority": {"enum": ["high", "low"]}},
              "required": ["priority"]}
    rows = [{"id": "t1", "prompt": "Server down. Priority as JSON?", "expected": {"priority": "high"}},
            {"id": "t2", "prompt": "Typo on a page. Priority as JSON?", "expected": {"priority": "low"}}]
    data = tmp_path / "tickets.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    spec = EvalSetSpec(name="tickets", path=data,
                       scorer={"kind": "json", "schema": schema, "field": "expected"})
    with FakeChat(answer='{"priority": "high"}') as server:
        task = run_evalset(server.base_url, server.model, spec, tmp_path / "out", count_tokens=None,
                           num_concurrent=1, structured_output=True)
        bodies = list(server.requests)
    assert [b["response_format"]["json_schema"]["schema"] for b in bodies] == [schema, schema]
    assert {item.id: item.score for item in task.items} == {"t1": 1.0, "t2": 0.0}


def test_a_structured_stage_needs_items_that_declare_a_schema():
    assert schema_items(EvalSetSpec(name="business", limit=6)) == 2
    assert schema_items(EvalSetSpec(name="business", limit=2)) == 0  # biz-0000, -0001: no json
    assert schema_items(EvalSetSpec(name="business", groups=["json"], limit=5)) == 5
    check_schema_items("s", [EvalSetSpec(name="math"), EvalSetSpec(name="business", limit=3)])
    with pytest.raises(SpecError, match="stage 's' is structured_output but none of the eval sets "
                                        r"\(math, conversation\) declares a JSON Schema"):
        check_schema_items("s", [EvalSetSpec(name="math"), EvalSetSpec(name="conversation")])


def test_the_flow_asks_the_quality_and_load_runs_with_the_stage_options(tmp_path, monkeypatch):
    spec = load_spec(structured_spec(tmp_path))
    parent, stage = plan(spec)[1:]
    asked = {}
    monkeypatch.setattr(tasks, "run_quality", lambda *args, **kwargs: asked.setdefault(
        "quality", []).append(kwargs) or QualityResult())
    monkeypatch.setattr(tasks, "run_load",
                        lambda *args, **kwargs: asked.setdefault("load", []).append(kwargs))
    facts = type("Facts", (), {"base_url": "http://s", "model": "m", "max_model_len": 2048,
                               "kv_cache_tokens": None})()
    settings = type("Settings", (), {"num_concurrent": 1})()
    for served in (parent, stage):
        tasks.measure_quality.fn(facts, served, spec, tmp_path, settings)
        tasks.measure_load.fn(facts, LOAD, tmp_path, None, served.load_body or None)
    assert [k["structured_output"] for k in asked["quality"]] == [False, True]
    assert [k["request_body"] for k in asked["load"]] == [None, stage.load_body]
