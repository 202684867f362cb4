"""The scoring corpus: the baseline's answers rendered with the chat template into token ids,
scored spans on the answers and prompts (not the fixed header), long items left out, the same
tokens scored by every stage."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from evalsets import perplexity
from evalsets.perplexity import LOGPROBS_FILE, measure_perplexity, read_logprobs
from evalsets.runner import SAMPLES_FILE, prepare_corpus
from evalsets.token_corpus import CORPUS_FILE, ScoringCorpus, build_corpus, logged_items
from infra.errors import MeasurementError

SPECIAL = {"<|im_start|>": 1, "<|im_end|>": 2}
SYSTEM = "<|im_start|>system\nBe brief.<|im_end|>\n"


class ChatTokenizer:
    """Characters as tokens, ChatML specials as single ids, a fixed system prompt: SmolLM2-like."""

    eos_token_id = SPECIAL["<|im_end|>"]

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        pieces = re.split(r"(<\|im_start\|>|<\|im_end\|>)", text)
        ids = [SPECIAL[p] if p in SPECIAL else None for p in pieces]
        out = []
        for piece, special in zip(pieces, ids, strict=True):
            out += [special] if special else [ord(c) + 10 for c in piece]
        return {"input_ids": out}

    def apply_chat_template(self, messages, add_generation_prompt: bool, tokenize: bool) -> str:
        assert tokenize is False
        text = SYSTEM + "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
                                for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def _samples(folder, rows):
    """lm-eval's samples file as the runner stores it (chat prompt = JsonChatStr, a 1-list)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / SAMPLES_FILE).open("w") as out:
        for item_id, prompt, answer in rows:
            chat = json.dumps([{"role": "user", "content": prompt}])
            out.write(json.dumps({"doc_id": 0, "doc": {"id": item_id},
                                  "arguments": [[[chat], {"until": ["x"]}]],
                                  "resps": [[answer]], "filtered_resps": [answer[:1]]}) + "\n")


@pytest.fixture
def prose(tmp_path):
    folder = tmp_path / "prose"
    folder.mkdir()
    (folder / "garden.txt").write_text("Roses grow.")
    return folder


def test_logged_items_read_the_chat_prompt_and_the_raw_response(tmp_path):
    _samples(tmp_path / "math", [("m1", "2+3?", "It is 5.")])
    ((item_id, messages, answer),) = logged_items(tmp_path / "math" / SAMPLES_FILE)
    assert (item_id, messages, answer) == ("m1", [{"role": "user", "content": "2+3?"}], "It is 5.")


def test_corpus_scores_answers_and_prompts_not_the_header(tmp_path, prose):
    quality = tmp_path / "quality"
    _samples(quality / "math", [("m1", "2+3?", "It is 5."), ("m2", "x" * 300, "long")])
    corpus = build_corpus(quality, ["math"], ChatTokenizer(), prose_dir=prose, max_sequence_tokens=100)
    tok = ChatTokenizer()
    decode = {v: k for k, v in SPECIAL.items()}

    def text(ids):
        return "".join(decode.get(i) or chr(i - 10) for i in ids)

    first, garden = corpus.sequences
    spans = {span.name: text(first.token_ids[span.start:span.end]) for span in first.spans}
    assert spans == {"math/m1/prompt": "2+3?<|im_end|>\n<|im_start|>assistant\n",
                     "math/m1/answer": "It is 5.<|im_end|>"}
    # What the server saw, ending at the turn's end-of-sequence (the template's newline dropped).
    rendered = tok.apply_chat_template([{"role": "user", "content": "2+3?"}], True, False)
    assert text(first.token_ids) == rendered + "It is 5.<|im_end|>"
    assert corpus.skipped == ["math/m2: 343 tokens > 100"]
    assert garden.name == "prose/garden" and garden.spans[0].start == 1
    assert corpus.tokens == 17 + 9 + 10  # prompt, answer + end of turn, prose after its first token


def test_a_sampled_set_gives_the_corpus_its_first_sample_s_answers(tmp_path, prose):
    """A sampled set keeps each sample's lm-eval files in <set>-s<j>/ (the runner): the corpus
    takes sample 0's answers, not 'no lm-eval samples' and prose only."""
    quality = tmp_path / "quality"
    _samples(quality / "math-s0", [("m1", "2+3?", "It is 5.")])
    _samples(quality / "math-s1", [("m1", "2+3?", "Five.")])
    corpus = build_corpus(quality, ["math"], ChatTokenizer(), prose_dir=prose)
    assert [span.name for span in corpus.sequences[0].spans] == ["math/m1/prompt",
                                                                 "math/m1/answer"]
    assert corpus.tokens == 17 + 9 + 10  # as the greedy set's "It is 5." above
    with pytest.raises(MeasurementError, match="no lm-eval samples for 'code'"):
        build_corpus(quality, ["code"], ChatTokenizer(), prose_dir=prose)


def test_later_stages_score_the_baselines_corpus(tmp_path, prose, monkeypatch):
    base, stage = tmp_path / "base", tmp_path / "stage"
    _samples(base / "math", [("m1", "2+3?", "It is 5.")])
    monkeypatch.setattr("evalsets.token_corpus.load_tokenizer", lambda folder: ChatTokenizer())
    monkeypatch.setattr("evalsets.token_corpus.PROSE_DIR", prose)
    prepare_corpus(base, None, tmp_path / "tokenizer", ["math"], True, max_model_len=4096)
    prepare_corpus(stage, base, tmp_path / "other-tokenizer", ["math"], True)
    assert (stage / CORPUS_FILE).read_text() == (base / CORPUS_FILE).read_text()
    corpus = ScoringCorpus.read(stage)
    assert [s.name for s in corpus.sequences] == ["math/m1", "prose/garden"]

    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        ids = body["prompt"]
        tokens = [f"token_id:{i}" for i in [*ids, 0]]
        logprobs = [None] + [-0.5] * (len(ids) - 1) + [-9.0]
        top = [None] + [{t: -0.5} for t in tokens[1:]]
        return httpx.Response(200, json={
            "choices": [{"logprobs": {"tokens": tokens, "token_logprobs": logprobs,
                                      "top_logprobs": top}}],
            "usage": {"prompt_tokens": len(ids)}})

    real_client = httpx.Client
    monkeypatch.setattr(perplexity.httpx, "Client",
                        lambda **kw: real_client(transport=httpx.MockTransport(handler), **kw))
    result = measure_perplexity("http://fake", "m", stage, concurrency=2)
    assert sorted(tuple(b["prompt"]) for b in sent) == sorted(tuple(s.token_ids)
                                                             for s in corpus.sequences)
    assert all((b["echo"], b["max_tokens"], b["logprobs"]) == (True, 1, 20) for b in sent)
    saved = read_logprobs(stage / LOGPROBS_FILE)["texts"]
    assert set(saved) == {"math/m1/prompt", "math/m1/answer", "prose/garden"}
    answer = next(s for s in corpus.sequences[0].spans if s.name.endswith("answer"))
    assert saved["math/m1/answer"]["tokens"] == [f"token_id:{i}" for i in
                                                 corpus.sequences[0].token_ids[answer.start:answer.end]]
    assert result.tokens == corpus.tokens


def test_items_longer_than_the_served_context_are_left_out(tmp_path, prose, monkeypatch):
    _samples(tmp_path / "math", [("m1", "2+3?", "It is 5."), ("m2", "x" * 60, "long")])
    monkeypatch.setattr("evalsets.token_corpus.load_tokenizer", lambda folder: ChatTokenizer())
    monkeypatch.setattr("evalsets.token_corpus.PROSE_DIR", prose)
    prepare_corpus(tmp_path, None, tmp_path / "tokenizer", ["math"], True, max_model_len=80)
    corpus = ScoringCorpus.read(tmp_path)
    # echo=true with max_tokens=1 needs one position more than the sequence: 79 at most here
    assert [s.name for s in corpus.sequences] == ["math/m1", "prose/garden"]
    assert corpus.skipped == ["math/m2: 103 tokens > 79"]


def test_a_budget_gives_each_set_an_equal_share_of_its_first_items(tmp_path, prose):
    """A small set keeps every item; the large ones share what it left, each its first items;
    the prose is always in; what was left out is said once per set."""
    quality = tmp_path / "quality"
    _samples(quality / "math", [(f"m{i}", "x" * 20, "y" * 20) for i in range(40)])
    _samples(quality / "code", [(f"c{i}", "x" * 20, "y" * 20) for i in range(40)])
    _samples(quality / "tiny", [("t0", "x" * 20, "y" * 20)])
    whole = build_corpus(quality, ["math", "code", "tiny"], ChatTokenizer(), prose_dir=prose)
    per_item = (whole.tokens - 10) // 81  # every item scores alike here; the prose 10
    budget = 10 + per_item * 21 + per_item // 2  # room for 21 items and half of another
    corpus = build_corpus(quality, ["math", "code", "tiny"], ChatTokenizer(), prose_dir=prose,
                          max_tokens=budget)
    names = [s.name for s in corpus.sequences]
    assert names == ([f"math/m{i}" for i in range(10)] + [f"code/c{i}" for i in range(10)]
                     + ["tiny/t0", "prose/garden"])
    assert corpus.tokens <= budget
    assert corpus.skipped == [f"math: 30 items over the corpus budget of {budget:,} scored tokens",
                              f"code: 30 items over the corpus budget of {budget:,} scored tokens"]
    # A budget the sets fit in changes nothing.
    assert build_corpus(quality, ["math", "code", "tiny"], ChatTokenizer(), prose_dir=prose,
                        max_tokens=whole.tokens) == whole


def test_the_policy_budget_reaches_the_baselines_corpus(tmp_path, prose, monkeypatch):
    from gates.policy import load_policy

    _samples(tmp_path / "math", [(f"m{i}", "x" * 20, "y" * 20) for i in range(3000)])
    monkeypatch.setattr("evalsets.token_corpus.load_tokenizer", lambda folder: ChatTokenizer())
    monkeypatch.setattr("evalsets.token_corpus.PROSE_DIR", prose)
    budget = load_policy("default").divergence.corpus_tokens
    prepare_corpus(tmp_path, None, tmp_path / "tokenizer", ["math"], True, corpus_tokens=budget)
    corpus = ScoringCorpus.read(tmp_path)
    assert budget - 60 < corpus.tokens <= budget  # full, to within one item


def test_a_budget_below_min_blocks_is_refused_by_the_policy():
    from gates.policy import DivergenceRules

    with pytest.raises(ValueError, match="corpus_tokens 2,400 cannot hold min_blocks 40 blocks"):
        DivergenceRules(corpus_tokens=2_400, min_blocks=40, block_tokens=64)
    assert DivergenceRules(corpus_tokens=2_000, min_blocks=10).corpus_tokens == 2_000


def test_without_a_tokenizer_the_prose_is_scored_as_text(tmp_path, monkeypatch):
    from infra.errors import MeasurementError

    def no_tokenizer(folder):
        raise MeasurementError(f"scoring corpus: no tokenizer in {folder}")

    monkeypatch.setattr("evalsets.token_corpus.load_tokenizer", no_tokenizer)
    prepare_corpus(tmp_path / "base", None, tmp_path / "no-tokenizer", [], True)
    assert ScoringCorpus.read(tmp_path / "base") is None


def test_a_tokenizer_without_a_chat_template_is_a_measurement_error_not_a_traceback(tmp_path):
    """validate refuses such a baseline first; the corpus still fails in one named line, and
    the runner then scores the prose alone."""
    from tests.flows.test_bad_inputs import tiny_tokenizer

    tiny_tokenizer(tmp_path / "tokenizer.json")
    _samples(tmp_path / "quality" / "math", [("m1", "2+3?", "It is 5.")])
    with pytest.raises(MeasurementError, match=f"scoring corpus: {tmp_path} has no chat template"):
        build_corpus(tmp_path / "quality", ["math"], tmp_path, chat_template=True)
    plain = build_corpus(tmp_path / "quality", ["math"], tmp_path, chat_template=False)
    assert [s.name for s in plain.sequences][0] == "math/m1"
