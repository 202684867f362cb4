"""The business set's generator: seeded, and the committed data.jsonl is what it writes."""

from __future__ import annotations

import json

from tools.generators import business as generate

ROWS = generate.generate()


def test_same_seed_same_items_and_committed_file_matches():
    assert ROWS == generate.generate()
    on_disk = [json.loads(line) for line in generate.DATA_PATH.read_text().splitlines()]
    assert on_disk == ROWS, "data.jsonl is stale: run python -m tools.generators.business"
    assert generate.generate(seed=1) != generate.generate(seed=2)


def test_a_smaller_pool_is_a_prefix_of_a_larger_one():
    assert generate.generate(120) == ROWS[:120]
