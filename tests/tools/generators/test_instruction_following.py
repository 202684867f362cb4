"""The instruction-following set's generator: the committed set is what it writes."""

from __future__ import annotations

import collections

from evalsets.contracts import validate_sets
from evalsets.spec import EvalSetSpec
from tests.evalsets.test_instruction_following import ANSWERS, ROWS
from tools.generators import instruction_following as generate


def test_committed_set_is_the_generators_and_covers_the_instruction_kinds():
    assert generate.generate() == ROWS, "data.jsonl is stale: python -m " \
                                        "tools.generators.instruction_following"
    assert len(ROWS) == 40 and len({r["id"] for r in ROWS}) == 40
    assert collections.Counter(r["kind"] for r in ROWS) == dict.fromkeys(ANSWERS, 4)
    assert {r["kind"] for r in ROWS[:10]} == set(ANSWERS)  # limit 10: every template once
    ids = {i for r in ROWS for i in r["instruction_id_list"]}
    assert {"length_constraints:number_words", "detectable_format:json_format",
            "change_case:english_lowercase", "punctuation:no_comma", "keywords:existence",
            "detectable_format:number_bullet_lists"} <= ids
    assert validate_sets([EvalSetSpec(name="instruction_following")]) == {
        "instruction_following": 40}
