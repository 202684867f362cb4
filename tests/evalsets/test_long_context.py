"""The long-context set: its committed items balanced over the token buckets, keys graded."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from evalsets.long_context.buckets import load_buckets
from evalsets.long_context.grading import extract_key, process_results


def _rows() -> list[dict]:
    path = Path(__file__).resolve().parents[2] / "evalsets/long_context/data.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_buckets_from_contract_shortest_first():
    buckets = load_buckets()
    assert [b.name for b in buckets] == ["512", "1k", "2k", "4k"]
    assert all(b.min_tokens < b.max_tokens for b in buckets)
    assert buckets[-1].max_tokens + 64 + 16 <= 4096  # 4k still fits a 4096 context


def test_committed_file_has_120_per_bucket_and_any_prefix_is_balanced():
    rows = _rows()
    names = [b.name for b in load_buckets()]
    per_bucket = collections.Counter(row["bucket"] for row in rows)
    assert set(per_bucket) == set(names)
    assert min(per_bucket.values()) >= 120
    assert [row["bucket"] for row in rows] == names * (len(rows) // len(names))
    assert collections.Counter(row["bucket"] for row in rows[:40]) == dict.fromkeys(names, 10)
    kinds = collections.Counter((row["bucket"], row["kind"]) for row in rows[:40])
    assert set(kinds.values()) == {5}  # the demo's limit 40: 5 single + 5 multi per bucket
    assert len({row["id"] for row in rows}) == len(rows)
    assert len({row["context"] for row in rows}) == len(rows)


@pytest.mark.parametrize(
    ("response", "key"),
    [("12345", "12345"), ("The pass key is 54321.", "54321"), ("key: 123456", None),
     ("1,234", None), ("It is 11111 or 22222", "11111"), ("", None)],
)
def test_extract_key(response, key):
    assert extract_key(response) == key


def test_grading_hook():
    doc = {"answer": "48213"}
    assert process_results(doc, ["48213"]) == {"exact_match": 1.0}
    assert process_results(doc, ["The pass key is 48231"]) == {"exact_match": 0.0}
