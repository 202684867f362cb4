"""The math generator is deterministic, and every answer follows from its question."""

from __future__ import annotations

import json
import re

import pytest

from tools.generators import math as generate


def _numbers(question: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", question)]


# Per template (items cycle through them in order): the answer from the question's numbers.
RECOMPUTE = [
    lambda n: n[0] + n[1],  # add small
    lambda n: n[0] - n[1],  # subtract small
    lambda n: n[0] * n[1],  # times small
    lambda n: n[0] + n[1] - n[2],  # buy and give
    lambda n: n[0] * n[1],  # boxes
    lambda n: n[0] // n[1],  # share
    lambda n: n[0] * n[1] * n[2],  # wage
    lambda n: n[2] - n[0] * n[1],  # change
    lambda n: n[0] * n[1] + n[2],  # distance
    lambda n: n[0] + n[1] + n[2],  # ages
    lambda n: n[0] * n[1] + n[2],  # pages
    lambda n: 2 * n[0] - n[1],  # double then subtract
    lambda n: n[0] * n[1] - n[2],  # rows
]


def test_same_seed_same_problems_and_committed_file_matches():
    problems = generate.generate()
    assert problems == generate.generate()
    on_disk = [json.loads(line) for line in generate.DATA_PATH.read_text().splitlines()]
    assert on_disk == problems, "data.jsonl is stale: run python -m tools.generators.math"


def test_other_seed_other_problems():
    assert generate.generate(seed=1) != generate.generate(seed=2)


def test_enough_items_with_unique_ids_and_integer_answers():
    problems = generate.generate()
    assert len(problems) >= 1000
    assert len({p["id"] for p in problems}) == len(problems)
    assert len({p["question"] for p in problems}) == len(problems), "a question appears twice"
    assert set(problems[0]) == {"id", "question", "answer", "template"}
    for problem in problems:
        assert int(problem["answer"]) >= 0
        assert str(int(problem["answer"])) == problem["answer"]


@pytest.mark.parametrize("index", range(len(RECOMPUTE)))
def test_answers_recomputed_from_question(index):
    assert len(generate.TEMPLATES) == len(RECOMPUTE)
    for problem in generate.generate()[index :: len(RECOMPUTE)]:
        numbers = _numbers(problem["question"])
        assert str(RECOMPUTE[index](numbers)) == problem["answer"], problem


def test_a_smaller_pool_is_a_prefix_of_a_larger_one():
    """`limit: N` and a pool of N items are the same items, whatever the pool size."""
    pool = generate.generate()
    assert generate.generate(260) == pool[:260]
    assert generate.generate(7) == pool[:7]


def test_every_prefix_mixes_warm_ups_and_harder_problems():
    warm_up = re.compile(r"gets \d more\.|gives away|There are \d bags")
    flags = [bool(warm_up.search(p["question"])) for p in generate.generate()]
    for limit in (13, 20, 60, 100, 260, 500, 1000):
        expected = limit * 3 / len(RECOMPUTE)
        assert abs(sum(flags[:limit]) - expected) <= 2, (limit, sum(flags[:limit]))


def test_share_divides_evenly():
    for problem in generate.generate()[5 :: len(RECOMPUTE)]:
        total, friends = _numbers(problem["question"])
        assert total % friends == 0


def test_cli_writes_file(tmp_path):
    out = tmp_path / "data.jsonl"
    generate.main(["--count", "12", "--seed", "7", "--out", str(out)])
    lines = out.read_text().splitlines()
    assert [json.loads(line) for line in lines] == generate.generate(12, 7)
