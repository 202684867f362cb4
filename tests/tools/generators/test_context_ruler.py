"""The long-context family's generator: RULER's kinds sized to the served model, every item answerable
from its context, a set written for a longer context validated."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import pytest

from evalsets.context_ruler.buckets import buckets_for
from evalsets.contracts import fit_to_context, validate_sets
from evalsets.spec import EvalSetSpec
from infra.errors import SpecError
from tools.generators import context_ruler as generate
from tools.generators.ruler_kinds import KINDS

TOKENIZER_JSON = Path(__file__).resolve().parents[3] / "models/smollm2-135m-bf16/tokenizer.json"


def _words(text: str) -> int:
    return len(text.split())


def _rows(path: Path = generate.FOLDER / "data.jsonl") -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _assignments(context: str) -> dict[str, str]:
    return dict(re.findall(r"VAR ([A-Z]{5}) = (?:VAR )?([A-Z]{5}|\d{5})\.", context))


def _solve(item: dict) -> set[str]:
    """What a perfect reader answers, read off the context alone."""
    context, question = item["context"], item["question"]
    if item["kind"].startswith("niah"):
        key = re.search(r"magic numbers? for (\w+) mentioned", question).group(1)
        return set(re.findall(rf"magic numbers for {key} is: (\d{{7}})\.", context))
    if item["kind"] == "variable_tracking":
        value = re.search(r"the value (\d{5})", question).group(1)
        assigned = _assignments(context)

        def holds(name: str) -> bool:
            target = assigned.get(name)
            return target == value or (target in assigned and holds(target))

        return {name for name in assigned if holds(name)}
    counts = collections.Counter(re.findall(r"\d+\. (\w+)", context.split("\n\n", 1)[1]))
    (_, third), (_, fourth) = counts.most_common(4)[2:4]
    assert third > fourth  # the three common words are strictly the most frequent
    return {word for word, _ in counts.most_common(3)}


def test_a_longer_chat_template_shortens_every_bucket():
    count, template = generate.served_tokenizer(generate.TOKENIZER_DIR)
    assert template == 30  # SmolLM2's ChatML around one user turn: within the contracts' margin
    assert count("Hello world") == 2
    assert buckets_for(8192, template_tokens=template) == buckets_for(8192)
    long_template = buckets_for(8192, template_tokens=200)
    assert [b.max_tokens for b in long_template] == [b.max_tokens - 136 for b in buckets_for(8192)]


def test_a_tokenizer_that_is_not_there_is_one_line():
    with pytest.raises(SystemExit, match="^context_ruler: --tokenizer /nonexistent/model: no such"):
        generate.main(["--tokenizer", "/nonexistent/model", "--out", "/nonexistent/out"])


def test_a_context_below_the_shortest_bucket_is_refused():
    with pytest.raises(ValueError, match="below the shortest bucket"):
        buckets_for(256)
    with pytest.raises(SystemExit, match="context_ruler: max_model_len 256"):
        generate.main(["--max-model-len", "256", "--out", "/nonexistent/never-written"])


def test_items_interleave_buckets_kinds_in_turn_and_fit_their_bucket():
    buckets = buckets_for(4096)
    items = generate.generate(_words, buckets, per_bucket=5, seed=3)
    assert [i["bucket"] for i in items] == [b.name for b in buckets] * 5
    assert [i["kind"] for i in items[::4]] == list(KINDS)
    for item, bucket in zip(items, buckets * 5, strict=True):
        assert bucket.min_tokens <= item["prompt_tokens"] <= bucket.max_tokens
        assert item["prompt_tokens"] == _words(generate.render(item["context"], item["question"]))
    assert len({i["id"] for i in items}) == len(items)


def test_same_seed_same_items_and_longer_contexts_keep_the_shorter_items():
    short = generate.generate(_words, buckets_for(2048), per_bucket=2, seed=3)
    assert short == generate.generate(_words, buckets_for(2048), per_bucket=2, seed=3)
    assert short != generate.generate(_words, buckets_for(2048), per_bucket=2, seed=4)
    longer = generate.generate(_words, buckets_for(8192), per_bucket=3, seed=3)
    assert [i for i in longer if i["bucket"] in ("512", "1k", "2k") and
            int(i["id"][-3:]) < 2] == short


def test_every_kind_is_answerable_from_the_context_alone_at_every_length():
    items = generate.generate(_words, buckets_for(8192), per_bucket=5, seed=11)
    for item in items:
        assert _solve(item) == set(item["answers"]), item["id"]
        assert item["answer"] == ", ".join(item["answers"])
    multikey = [i for i in items if i["kind"] == "niah_multikey"]
    assert all(len(re.findall(r"magic numbers for \w+ is", i["context"])) == 4 for i in multikey)


def test_committed_set_is_the_demo_models_family_to_8k():
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_file(str(TOKENIZER_JSON))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    buckets = buckets_for(generate.DEMO_MAX_MODEL_LEN)
    rows = _rows()
    assert collections.Counter(r["bucket"] for r in rows) == dict.fromkeys(
        ["512", "1k", "2k", "4k", "8k"], 20)
    assert generate.generate(count, buckets) == rows, (
        "data.jsonl is stale: run python -m tools.generators.context_ruler")
    assert (generate.FOLDER / "contract.yaml").read_text() == generate.contract_text(
        buckets, generate.TOKENIZER_DIR, generate.DEMO_MAX_MODEL_LEN)
    assert validate_sets([EvalSetSpec(name="context_ruler")]) == {"context_ruler": 100}
    # Served at 4096 the 8k bucket is left out, never truncated.
    (fitted,) = fit_to_context([EvalSetSpec(name="context_ruler")], 4096)
    assert fitted.groups == ["512", "1k", "2k", "4k"]


def test_a_written_set_for_a_longer_context_validates_and_its_contract_bites(tmp_path):
    folder = tmp_path / "ruler-16k"
    buckets = generate.write_set(folder, 16384, _words, Path("words"), per_bucket=2, seed=5)
    assert [b.name for b in buckets][-1] == "16k"
    assert {p.name for p in folder.iterdir()} == {"data.jsonl", "contract.yaml", "task.yaml",
                                                 "grading.py"}
    spec = EvalSetSpec(name="ruler_16k", path=folder)
    assert validate_sets([spec]) == {"ruler_16k": 12}
    (fitted,) = fit_to_context([spec], 8192)
    assert fitted.groups == ["512", "1k", "2k", "4k", "8k"]
    rows = _rows(folder / "data.jsonl")
    rows[3]["prompt_tokens"] = 100  # claims a 4k item is far shorter than its bucket allows
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SpecError, match=r"data.jsonl:4: .*cr-4k-000.*at least its group's minimum"):
        validate_sets([spec])
