"""The long-context family: buckets doubling to the served context, answers graded as whole tokens,
and the committed set run through lm-eval like any set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalsets.context_ruler.buckets import bucket_name, bucket_tokens, buckets_for
from evalsets.context_ruler.grading import process_results, score
from evalsets.contracts import TEMPLATE_MARGIN_TOKENS
from evalsets.spec import EvalSetSpec

DATA_PATH = Path(__file__).resolve().parents[2] / "evalsets/context_ruler/data.jsonl"


def _rows(path: Path = DATA_PATH) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize(("max_model_len", "names"), [
    (4096, ["512", "1k", "2k", "4k"]),
    (8192, ["512", "1k", "2k", "4k", "8k"]),
    (40960, ["512", "1k", "2k", "4k", "8k", "16k", "32k", "40k"]),
    (131072, ["512", "1k", "2k", "4k", "8k", "16k", "32k", "64k", "128k"]),
    (9000, ["512", "1k", "2k", "4k", "8k"]),  # 9000 is not far enough past 8k for its own
])
def test_buckets_double_up_to_the_served_context(max_model_len, names):
    buckets = buckets_for(max_model_len)
    assert [b.name for b in buckets] == names
    for bucket in buckets:
        nominal = bucket_tokens(bucket.name)
        assert bucket_name(nominal) == bucket.name
        assert 0 < bucket.min_tokens < bucket.max_tokens
        # The longest prompt, the chat template and the answer fit the bucket's own length.
        assert bucket.max_tokens + TEMPLATE_MARGIN_TOKENS + 64 == nominal <= max_model_len


@pytest.mark.parametrize(("answers", "response", "expected"), [
    (["1234567"], "The number is 1234567.", 1.0),
    (["1234567"], "12345678", 0.0),  # inside a longer number
    (["otter", "basket"], "Basket, OTTER", 1.0),
    (["otter", "basket"], "otter, baskets", 0.0),
    (["AAAAA", "BBBBB"], "AAAAA", 0.0),
    ([], "anything", 0.0),
])
def test_grading_needs_every_answer_as_a_whole_token(answers, response, expected):
    assert score(answers, response) == expected
    assert process_results({"answers": answers}, [response]) == {"match_all": expected}


def test_runs_through_lm_eval_with_buckets_as_groups(tmp_path):
    from evalsets.runner import run_evalset
    from tests.evalsets.chat_fake import FakeChat

    first = _rows()[0]
    with FakeChat(answer=f"It is {first['answer']}.") as fake:
        task = run_evalset(fake.base_url, fake.model, EvalSetSpec(name="context_ruler", limit=5),
                           tmp_path, None)
    assert task.metric == "match_all"
    assert [i.group for i in task.items] == ["512", "1k", "2k", "4k", "8k"]
    assert [i.score for i in task.items] == [1.0, 0.0, 0.0, 0.0, 0.0]
    # Five distinct prompts, in whatever order the client sent them (a retry under load repeats one).
    prompts = {r["messages"][-1]["content"] for r in fake.requests}
    assert len(prompts) == 5
    assert any(first["context"] in prompt for prompt in prompts)
