"""The long-context generator: deterministic items inside their token buckets, keys findable."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from evalsets.long_context.buckets import load_buckets
from tools.generators import long_context as generate

TOKENIZER_JSON = Path(__file__).resolve().parents[3] / "models/smollm2-135m-bf16/tokenizer.json"


def _words(text: str) -> int:
    return len(text.split())


def _rows() -> list[dict]:
    return [json.loads(line) for line in generate.DATA_PATH.read_text().splitlines()]


def test_same_seed_same_items_other_seed_other_items():
    first = generate.generate(_words, per_bucket=2, seed=3)
    assert first == generate.generate(_words, per_bucket=2, seed=3)
    assert first != generate.generate(_words, per_bucket=2, seed=4)


def test_items_interleave_buckets_and_mix_kinds():
    items = generate.generate(_words, per_bucket=2, seed=3)
    assert [i["bucket"] for i in items] == ["512", "1k", "2k", "4k"] * 2
    assert {i["kind"] for i in items[:4]} == {"single"}
    assert {i["kind"] for i in items[4:]} == {"multi"}
    assert len({i["id"] for i in items}) == len(items)


def test_measured_length_is_inside_bucket_and_true():
    bounds = {b.name: b for b in load_buckets()}
    for item in generate.generate(_words, per_bucket=2, seed=5):
        bucket = bounds[item["bucket"]]
        assert bucket.min_tokens <= item["prompt_tokens"] <= bucket.max_tokens
        assert item["prompt_tokens"] == _words(generate.render(item["context"], item["question"]))


def test_answer_is_hidden_in_context_and_multi_key_asks_one_door():
    for item in generate.generate(_words, per_bucket=2, seed=6):
        keys = re.findall(r"pass key(?: for the (\w+) door)? is (\d{5})", item["context"])
        if item["kind"] == "single":
            assert [key for _, key in keys] == [item["answer"]]
        else:
            assert len(keys) == 3 and len({key for _, key in keys}) == 3
            door = re.search(r"for the (\w+) door\?", item["question"]).group(1)
            assert dict(keys)[door] == item["answer"]


def test_committed_file_counts_are_the_models_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_file(str(TOKENIZER_JSON))
    rows = _rows()
    for row in rows:
        text = generate.render(row["context"], row["question"])
        assert len(tokenizer.encode(text, add_special_tokens=False).ids) == row["prompt_tokens"]


def test_more_per_bucket_keeps_the_first_items():
    assert generate.generate(_words, per_bucket=3, seed=3)[:8] == generate.generate(
        _words, per_bucket=2, seed=3)


def test_task_template_renders_like_the_generator():
    template = (generate.DATA_PATH.parent / "task.yaml").read_text()
    assert 'doc_to_text: "{{context}}\\n\\n{{question}}"' in template


def test_committed_file_is_what_the_generator_makes():
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_file(str(TOKENIZER_JSON))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    assert generate.generate(count) == _rows(), (
        "data.jsonl is stale: run python -m tools.generators.long_context"
    )
