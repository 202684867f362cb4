"""Perplexity maths on fake echo=true logprob payloads; files for later KL comparisons."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from evalsets import perplexity
from evalsets.perplexity import (
    CORPUS_DIR,
    measure_perplexity,
    parse_echo_logprobs,
    summarize,
)
from infra.errors import MeasurementError


def _payload(logprobs: list[float], generated: float = -9.0) -> dict:
    """A vLLM-shaped echo response: null first logprob, prompt positions, one generated token."""
    tokens = [f"token_id:{i}" for i in range(len(logprobs) + 2)]
    token_logprobs = [None, *logprobs, generated]
    pairs = zip(tokens[1:], token_logprobs[1:], strict=True)
    top = [None] + [{tok: lp, "token_id:999": lp - 1.0} for tok, lp in pairs]
    return {
        "choices": [{"logprobs": {"tokens": tokens, "token_logprobs": token_logprobs,
                                  "top_logprobs": top}}],
        "usage": {"prompt_tokens": len(logprobs) + 1, "completion_tokens": 1},
    }


def test_parse_drops_first_and_generated_tokens():
    parsed = parse_echo_logprobs(_payload([-1.0, -2.0, -3.0]))
    assert parsed.logprobs == [-1.0, -2.0, -3.0]
    assert parsed.tokens == ["token_id:1", "token_id:2", "token_id:3"]
    assert parsed.top[0] == {"token_id:1": -1.0, "token_id:999": -2.0}


def test_perplexity_is_token_weighted():
    result = summarize({
        "a": parse_echo_logprobs(_payload([-1.0, -3.0])),
        "b": parse_echo_logprobs(_payload([-2.0, -2.0, -2.0, -2.0])),
    })
    a, b = result.texts
    assert (a.tokens, a.sum_logprob) == (2, -4.0)
    assert a.perplexity == pytest.approx(math.exp(2.0))
    assert b.perplexity == pytest.approx(math.exp(2.0))
    assert (result.tokens, result.sum_logprob) == (6, -12.0)
    assert result.perplexity == pytest.approx(math.exp(12.0 / 6))


def test_certain_model_has_perplexity_one():
    result = summarize({"a": parse_echo_logprobs(_payload([0.0, 0.0]))})
    assert result.perplexity == 1.0


def test_missing_logprobs_are_errors():
    bad = _payload([-1.0, -2.0])
    bad["choices"][0]["logprobs"]["token_logprobs"][2] = None
    with pytest.raises(MeasurementError, match="no logprob"):
        parse_echo_logprobs(bad)
    with pytest.raises(MeasurementError, match="echo"):
        parse_echo_logprobs({"choices": [{"text": "x"}]})


def test_corpus_is_three_real_texts():
    texts = sorted(CORPUS_DIR.glob("*.txt"))
    assert len(texts) == 3
    for path in texts:
        assert 300 <= len(path.read_text().split()) <= 500


def test_measure_writes_results_and_logprobs(tmp_path, monkeypatch):
    requests = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        return httpx.Response(200, json=_payload([-0.5] * 10))

    real_client = httpx.Client
    monkeypatch.setattr(
        perplexity.httpx, "Client",
        lambda **kw: real_client(transport=httpx.MockTransport(handler), **kw),
    )
    result = measure_perplexity("http://fake", "m", tmp_path)
    sent = [(r["echo"], r["max_tokens"], r["logprobs"]) for r in requests]
    assert sent == [(True, 1, perplexity.TOP_LOGPROBS)] * 3
    assert result.tokens == 30
    assert result.perplexity == pytest.approx(math.exp(0.5))
    saved = perplexity.read_logprobs(tmp_path / perplexity.LOGPROBS_FILE)
    assert set(saved["texts"]) == {p.stem for p in CORPUS_DIR.glob("*.txt")}
    assert len(saved["texts"]["garden"]["top"]) == 10
    assert json.loads((tmp_path / "perplexity.json").read_text())["tokens"] == 30


def test_http_error_is_a_measurement_error(tmp_path, monkeypatch):
    real_client = httpx.Client
    monkeypatch.setattr(
        perplexity.httpx, "Client",
        lambda **kw: real_client(
            transport=httpx.MockTransport(lambda r: httpx.Response(400, text="bad")), **kw
        ),
    )
    with pytest.raises(MeasurementError, match="HTTP 400"):
        measure_perplexity("http://fake", "m", tmp_path)
