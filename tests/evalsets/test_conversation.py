"""The conversation set: answers that need earlier turns, graded per scorer."""

from __future__ import annotations

import json
import re
from itertools import permutations
from pathlib import Path

import pytest

from evalsets.contracts import validate_set
from evalsets.conversation.grading import doc_to_text, load_items, process_results
from evalsets.multiturn import decode_dialogue
from evalsets.spec import EvalSetSpec
from infra.errors import SpecError


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    path = Path(__file__).resolve().parents[2] / "evalsets/conversation/data.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_at_least_100_distinct_dialogues_of_two_to_four_exchanges(rows):
    assert len(rows) >= 100
    assert len({row["id"] for row in rows}) == len(rows)
    assert len({json.dumps(row["messages"]) for row in rows}) == len(rows)
    for row in rows:
        earlier = row["messages"][:-1]
        assert 2 <= len(earlier) // 2 <= 4, row["id"]
        assert [m["role"] for m in earlier] == ["user", "assistant"] * (len(earlier) // 2)
        assert row["messages"][-1]["role"] == "user"


def test_the_final_question_alone_never_holds_the_answer(rows):
    for row in rows:
        question = _norm(row["messages"][-1]["content"])
        assert _norm(row["reference"]) not in question, row["id"]
        assert not re.search(r"\d", question), row["id"]  # nothing to compute from it alone


def test_recalled_answers_come_from_earlier_turns(rows):
    recall = [row for row in rows if row["group"] == "recall"]
    assert recall
    for row in recall:
        earlier = _norm(" ".join(m["content"] for m in row["messages"][:-1]))
        assert _norm(row["reference"]) in earlier, row["id"]


def test_combined_answers_need_two_numbers_from_earlier_turns(rows):
    combine = [row for row in rows if row["group"] == "combine"]
    assert len(combine) >= 0.2 * len(rows)
    for row in combine:
        numbers = [int(n) for m in row["messages"][:-1]
                   for n in re.findall(r"\b\d{1,3}\b", m["content"])]
        answer = int(row["reference"])
        made = {op(a, b) for a, b in permutations(numbers, 2)
                for op in (lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x - y)}
        assert answer in made, row["id"]


def test_every_scorer_is_used_and_grades(rows):
    assert {row["scorer"] for row in rows} == {"exact", "contains", "numeric"}
    by_scorer = {row["scorer"]: row for row in rows}
    exact, contains, numeric = by_scorer["exact"], by_scorer["contains"], by_scorer["numeric"]
    assert process_results(exact, [f"**{exact['reference'].upper()}.**"]) == {"score": 1.0}
    assert process_results(exact, [f"It is {exact['reference']}"]) == {"score": 0.0}
    assert process_results(contains, [f"Sure: {contains['reference']}"]) == {"score": 1.0}
    assert process_results(contains, ["I do not know"]) == {"score": 0.0}
    assert process_results(numeric, [f"The answer is {numeric['reference']}."]) == {"score": 1.0}
    assert process_results(numeric, [f"{int(numeric['reference']) + 1}"]) == {"score": 0.0}


def test_doc_to_text_carries_the_dialogue(rows):
    assert decode_dialogue(doc_to_text(rows[0])) == rows[0]["messages"]


def test_the_contract_passes_and_names_a_broken_row(rows, tmp_path):
    assert validate_set(EvalSetSpec(name="conversation")) == len(rows)
    broken = [dict(row) for row in rows[:3]]
    broken[1]["messages"] = broken[1]["messages"][:-1]  # ends with the assistant's turn
    path = tmp_path / "broken.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in broken))
    with pytest.raises(SpecError, match=r"broken.jsonl:2: messages: .*last turn must be the user"):
        load_items(path)
