"""Load prompts replayed from an eval set or a file: their real lengths, counted by the tokenizer."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from infra.errors import MeasurementError, SpecError
from load.launch import locust_env
from load.profile import LoadProfile, PromptSource, load_profile
from load.prompts import IDS_FILE, bind, describe, prepare, read_texts, sized, source_digest
from load.runner import run_level

MATH_DATA = Path(__file__).resolve().parents[2] / "evalsets" / "math" / "data.jsonl"
WORDS = re.compile(r"\w+|[^\w\s]+")  # what the Whitespace pre-tokenizer splits on


def word_tokenizer(checkpoint: Path, texts: list[str]) -> Path:
    """A word-level tokenizer.json over the words of `texts` (ids from 1, 0 for unknown)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0}
    for text in texts:
        for word in WORDS.findall(text):
            vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    checkpoint.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(checkpoint / "tokenizer.json"))
    return checkpoint


def profile(prompts: dict, prompt_tokens: int = 400, **fields) -> LoadProfile:
    return LoadProfile(high_users=2, prompt_tokens=prompt_tokens, output_tokens=4, requests=6,
                       prompts=PromptSource(**prompts), **fields)


def math_questions() -> list[str]:
    return [json.loads(line)["question"] for line in MATH_DATA.read_text().splitlines() if line]


def test_evalset_prompts_keep_the_sets_length_distribution(tmp_path):
    questions = math_questions()
    checkpoint = word_tokenizer(tmp_path / "ckpt", [f"Question: {q}\nAnswer:" for q in questions])
    prompts = prepare(profile({"source": "evalset", "name": "math"}), checkpoint)
    # Independent count: the set's own rows, "Question: {question}\nAnswer:" split into words.
    expected = [len(WORDS.findall(q)) + 4 for q in questions]
    assert [len(ids) for ids in prompts.ids] == expected
    assert all(0 not in ids for ids in prompts.ids)  # every word known: real ids, not [UNK]
    assert prompts.left_out == 0 and len(set(expected)) > 5
    assert describe(profile({"source": "evalset", "name": "math"}), prompts) == (
        f"eval set math: {len(expected)} prompts of {min(expected)}-{max(expected)} tokens "
        f"(median {statistics.median(expected):g})")


def test_prompts_longer_than_prompt_tokens_are_left_out_and_counted(tmp_path):
    questions = math_questions()
    checkpoint = word_tokenizer(tmp_path / "ckpt", [f"Question: {q}\nAnswer:" for q in questions])
    lengths = sorted(len(WORDS.findall(q)) + 4 for q in questions)
    cap = lengths[len(lengths) // 2]
    prompts = prepare(profile({"source": "evalset", "name": "math"}, prompt_tokens=cap), checkpoint)
    assert max(len(ids) for ids in prompts.ids) <= cap
    assert prompts.left_out == sum(n > cap for n in lengths) > 0
    assert f"{prompts.left_out} longer than prompt_tokens ({cap}) left out" in prompts.describe()
    with pytest.raises(SpecError, match=r"none of \d+ prompts is 1 to 2 tokens"):
        prepare(profile({"source": "evalset", "name": "math"}, prompt_tokens=2), checkpoint)


def test_a_user_file_jsonl_or_plain_text(tmp_path):
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text('{"text": "one two three"}\n\n{"text": "four five"}\n')
    plain = tmp_path / "prompts.txt"
    plain.write_text("alpha beta\ngamma\n")
    assert read_texts(PromptSource(source="file", path=str(jsonl), field="text")) == (
        "file prompts.jsonl", ["one two three", "four five"])
    assert read_texts(PromptSource(source="file", path=str(plain))) == (
        "file prompts.txt", ["alpha beta", "gamma"])
    checkpoint = word_tokenizer(tmp_path / "ckpt", ["one two three four five"])
    prompts = prepare(profile({"source": "file", "path": str(jsonl), "field": "text"}), checkpoint)
    assert [len(ids) for ids in prompts.ids] == [3, 2]


def test_a_bad_prompt_line_is_named_by_file_line_and_field(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\n{"question": "no prompt field"}\n')
    with pytest.raises(SpecError, match=r"prompts\.jsonl:2: field 'prompt' is missing"):
        read_texts(PromptSource(source="file", path=str(path)))
    path.write_text('{"prompt": "fine"}\n{"prompt": \n')
    with pytest.raises(SpecError, match=r"prompts\.jsonl:2: not a JSON object"):
        read_texts(PromptSource(source="file", path=str(path)))


def test_profile_yaml_prompts_are_checked_and_a_relative_path_is_the_profiles(tmp_path):
    base = "high_users: 2\nprompt_tokens: 64\noutput_tokens: 4\nrequests: 6\n"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.txt").write_text("hello there\n")
    good = tmp_path / "good.yaml"
    good.write_text(base + "prompts: {source: file, path: data/mine.txt}\n")
    assert load_profile(good).prompts.path == str((tmp_path / "data" / "mine.txt").resolve())
    assert load_profile("ci").prompts.source == "random"
    for text, message in (
        ("prompts: {source: evalset, name: maths}", r"unknown eval set 'maths'.*did you mean 'math'"),
        ("prompts: {source: evalset}", r"prompts: .*source evalset needs name"),
        ("prompts: {source: file, name: math}", r"name is for source evalset, not file"),
        ("prompts: {source: tokens}", r"prompts\.source"),
    ):
        bad = tmp_path / "bad.yaml"
        bad.write_text(base + text + "\n")
        with pytest.raises(SpecError, match=message):
            load_profile(bad)


def test_unbound_source_prompts_are_never_replaced_by_random_ones(tmp_path):
    unbound = profile({"source": "evalset", "name": "math"})
    with pytest.raises(MeasurementError, match="were not tokenized for the served model"):
        locust_env("m", unbound, "low", None, 1)
    assert locust_env("m", profile({}), "low", None, 1)["QG_PROMPTS_FILE"] == ""


def test_source_digest_follows_the_file_content(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("a\n")
    source = PromptSource(source="file", path=str(path))
    first = source_digest(source)
    path.write_text("b\n")
    assert source_digest(source) != first
    assert source_digest(PromptSource()) is None
    assert source_digest(PromptSource(source="evalset", name="math")) is not None


def test_locust_replays_the_bound_prompts_and_records_their_token_counts(fake_openai, tmp_path):
    questions = math_questions()
    checkpoint = word_tokenizer(tmp_path / "ckpt", [f"Question: {q}\nAnswer:" for q in questions])
    source = profile({"source": "evalset", "name": "math"}, seed=3)
    prompts = prepare(source, checkpoint)
    bound = bind(source, prompts, tmp_path / "load")
    assert bound.prompt_ids == tmp_path / "load" / IDS_FILE
    samples = run_level(fake_openai.base_url, "fake-model", bound, "low", 2, tmp_path / "load")
    pool = set(prompts.ids)
    assert len(fake_openai.requests) == len(samples) == 6
    for body in fake_openai.requests:
        sent = body["prompt"]
        # The replayed prompt with one random token after its first (no prefix-cache hits).
        assert (sent[0], *sent[2:]) in pool and 1000 <= sent[1] <= 40000
    assert sorted(s.prompt_tokens for s in samples) == sorted(len(b["prompt"]) for b in
                                                              fake_openai.requests)
    assert len({s.prompt_tokens for s in samples}) > 1  # real lengths, not one fixed size


def test_the_stage_cache_key_follows_the_prompt_files_content(tmp_path, monkeypatch):
    from tests.flows.test_cache import keys, spec

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n")
    replayed = {"requests": 12, "output_tokens": 32,
                "prompts": {"source": "file", "path": str(path), "field": "prompt"}}
    the_spec = spec(tmp_path)
    before = keys(the_spec, profile=replayed)
    assert keys(the_spec, profile=replayed) == before
    path.write_text("an edited prompt\n")
    after = keys(the_spec, profile=replayed)
    assert all(after[name] != before[name] for name in before)


def test_the_bundled_math_prompts_profile_replays_the_math_set(tmp_path):
    bundled = load_profile("ci-math-prompts")
    questions = math_questions()
    checkpoint = word_tokenizer(tmp_path / "ckpt", [f"Question: {q}\nAnswer:" for q in questions])
    prompts = prepare(bundled, checkpoint)
    assert prompts.source == "eval set math" and len(prompts.ids) == len(questions)
    assert prompts.left_out == 0 and bundled.prompts.name == "math"


def test_the_what_if_is_given_the_mean_prompt_sent_not_the_longest(tmp_path):
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text('{"prompt": "a b c d e f g h"}\n{"prompt": "a b"}\n')
    checkpoint = word_tokenizer(tmp_path / "ckpt", ["a b c d e f g h"])
    replayed = profile({"source": "file", "path": str(jsonl)}, prompt_tokens=64)
    assert sized(replayed, prepare(replayed, checkpoint)).prompt_tokens == 6  # (9 + 3) / 2 sent
    assert sized(replayed, None).prompt_tokens == 64
