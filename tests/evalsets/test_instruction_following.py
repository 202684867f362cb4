"""Strict instruction following: IFEval's checkers (if-verifiable) score our own prompts; rows
the library would judge loosely (unknown ids, missing arguments, data not installed) are refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from evalsets import instruction_checks
from evalsets.contracts import validate_sets
from evalsets.scorers import InstructionsScorer
from evalsets.spec import EvalSetSpec
from infra.errors import SpecError

SCORER = InstructionsScorer(kind="instructions")
DATA_PATH = Path(__file__).resolve().parents[2] / "evalsets/instruction_following/data.jsonl"
ROWS = [json.loads(line) for line in DATA_PATH.read_text().splitlines()]
END_PHRASE = "Is there anything else I can help with?"  # the end_phrase kwarg of the data
# Per template: an answer that follows every instruction, and one that breaks one of them.
ANSWERS = {
    "lowercase": ("dear neighbour, i found a small grey cat in my garden this evening. it wears a "
                  "red collar and seems friendly. please come by if it is yours.",
                  "Dear neighbour, I found a small grey cat in my garden this evening."),
    "no_comma": ("Dear neighbour. I found a cat in my garden. It is safe and warm now.",
                 "Dear neighbour, I found a cat in my garden."),
    "word_count": ("I found your cat. Please call me.", " ".join(["cat"] * 60)),
    "json": ('```json\n{"note": "I found your cat"}\n```', 'Here it is: {"note": "cat"}'),
    "bullets": ("* one\n* two\n* three", "* one\n* two"),
    "keywords": ("{k1} and {k2}.", "{k1} only."),
    "end_phrase": (f"I found your cat. {END_PHRASE}",
                   f"{END_PHRASE} I found your cat."),
    "title": ("<<Found cat>>\nI found your cat.", "Found cat\nI found your cat."),
    "lowercase_no_comma": ("dear neighbour i found your grey cat in my garden this evening and it "
                           "is safe with me now so please come and collect it soon",
                           "dear neighbour, i found your grey cat in my garden this evening and "
                           "it is safe with me now so please come and collect it soon"),
    "length_postscript": (" ".join(["word"] * 45) + "\nP.S. thanks", " ".join(["word"] * 45)),
}


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_following_answers_pass_and_breaking_answers_fail(row):
    first, second = row["kwargs"][0].get("keywords", ["", ""])
    good, bad = (text.replace("{k1}", first).replace("{k2}", second)
                 for text in ANSWERS[row["kind"]])
    assert SCORER.score(good, row) == 1.0
    assert SCORER.score(bad, row) == 0.0


def test_empty_answers_and_bare_thinking_traces_fail():
    row = next(r for r in ROWS if r["kind"] == "word_count")  # "less than 60 words"
    assert SCORER.score("", row) == 0.0
    assert SCORER.score("<think>short", row) == 0.0
    assert SCORER.score("<think>long thoughts</think>I found your cat.", row) == 1.0


def test_language_guesses_are_repeatable():
    row = next(r for r in ROWS if r["kind"] == "lowercase")
    borderline = "ok. cat. garden. fine."
    assert len({SCORER.score(borderline, row) for _ in range(20)}) == 1


@pytest.mark.parametrize(("ids", "kwargs", "field", "why"), [
    (["keywords:existence"], [{}], "kwargs", r"missing \['keywords'\] .*at random"),
    (["punctuation:no_comas"], [{}], "instruction_id_list", "did you mean 'punctuation:no_comma'"),
    (["length_constraints:number_words"], [{"num_words": 5, "relation": "more than"}], "kwargs",
     "relation"),
    (["punctuation:no_comma"], [{"strict": True}], "kwargs", r"unknown \['strict'\]"),
    (["punctuation:no_comma", "change_case:english_lowercase"], [{}], "kwargs", "list of 2"),
    ([], [], "instruction_id_list", "non-empty list"),
])
def test_rows_the_library_would_judge_loosely_are_refused(ids, kwargs, field, why):
    found = SCORER.problem({"instruction_id_list": ids, "kwargs": kwargs})
    assert found is not None
    assert found[0] == field
    assert re.search(why, found[1]), found[1]


def test_an_instruction_needing_data_not_installed_is_refused_not_downloaded(monkeypatch):
    import nltk

    row = {"instruction_id_list": ["length_constraints:number_sentences"],
           "kwargs": [{"num_sentences": 3, "relation": "less than"}]}

    def absent(resource, *args, **kwargs):
        raise LookupError(resource)

    monkeypatch.setattr(nltk.data, "find", absent)
    field, why = SCORER.problem(row)
    assert field == "instruction_id_list"
    assert "punkt_tab" in why and "not installed" in why and "nothing is downloaded" in why
    assert "length_constraints:number_sentences" not in instruction_checks.offline_kinds()
    monkeypatch.setattr(nltk.data, "find", lambda resource, *a, **k: resource)
    assert SCORER.problem(row) is None


def test_the_file_is_a_user_set_too_and_a_bad_row_is_named(tmp_path):
    spec = EvalSetSpec(name="my_if", path=DATA_PATH, scorer={"kind": "instructions"})
    assert validate_sets([spec]) == {"my_if": 40}
    rows = [dict(r) for r in ROWS[:3]]
    rows[2]["kwargs"] = [{"num_bullets": None}]
    rows[2]["instruction_id_list"] = ["detectable_format:number_bullet_lists"]
    path = tmp_path / "if.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    broken = EvalSetSpec(name="my_if2", path=path, scorer={"kind": "instructions"})
    with pytest.raises(SpecError, match=r"if.jsonl:3: field 'kwargs' \(id 'if-word_count-0'\): "
                                        r".*missing \['num_bullets'\]"):
        validate_sets([broken])


def test_runs_through_lm_eval_with_prompt_level_strict_scores(tmp_path):
    from evalsets.runner import run_evalset
    from tests.evalsets.chat_fake import FakeChat

    with FakeChat(answer="<<Found cat>>\nThe cat with the red collar came this evening.") as fake:
        task = run_evalset(fake.base_url, fake.model,
                           EvalSetSpec(name="instruction_following", limit=10), tmp_path, None)
    assert task.metric == "prompt_strict"
    scores = {item.id.split("-")[1]: item.score for item in task.items}
    # A short answer with a title, no comma and the first task's keywords follows those four
    # templates, nothing else (the keywords' arguments came through lm-eval's dataset intact).
    assert {kind for kind, s in scores.items() if s == 1.0} == {"title", "word_count", "no_comma",
                                                                "keywords"}
    assert Path(tmp_path / "instruction_following").is_dir()
