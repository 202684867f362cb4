"""KL, top-1 agreement and the paired perplexity ratio from stored top-k logprobs: exact where
the support is complete, zero for identical runs, growing with the change, and refused when
tokens differ; stored per token (the gates compute the intervals)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from evalsets.perplexity import LOGPROBS_FILE
from gates.token_pairs import divergence, paired_tokens, perplexity_ratio, position_kl, summaries
from infra.errors import MeasurementError


def _dist(logits: np.ndarray) -> dict[str, float]:
    logprobs = logits - np.log(np.exp(logits).sum())
    return {f"token_id:{i}": float(lp) for i, lp in enumerate(logprobs)}


def _top(dist: dict[str, float], k: int) -> dict[str, float]:
    return dict(sorted(dist.items(), key=lambda kv: -kv[1])[:k])


def _file(path, texts: dict[str, list[dict[str, float]]], k: int, tokens=None):
    payload = {"model": "m", "top_logprobs": k, "texts": {
        name: {"tokens": (tokens or {}).get(name, [f"token_id:{i}" for i in range(len(tops))]),
               "logprobs": [max(t.values()) for t in tops], "top": tops}
        for name, tops in texts.items()}}
    path.mkdir(parents=True, exist_ok=True)
    (path / LOGPROBS_FILE).write_text(json.dumps(payload))
    return path


def _pair(rng, positions: int, vocab: int, noise: float):
    base, stage = [], []
    for _ in range(positions):
        logits = rng.normal(0, 3, vocab)
        base.append(_dist(logits))
        stage.append(_dist(logits + rng.normal(0, noise, vocab)))
    return base, stage


def _exact_kl(p: dict[str, float], q: dict[str, float]) -> float:
    return sum(math.exp(p[t]) * (p[t] - q[t]) for t in p)


def test_full_support_gives_exact_kl():
    rng = np.random.default_rng(0)
    (p,), (q,) = _pair(rng, 1, 8, 0.5)
    assert position_kl(p, q, top_k=8) == pytest.approx(_exact_kl(p, q), rel=1e-9)


def test_top_k_estimate_close_to_true_kl_for_peaked_distributions():
    rng = np.random.default_rng(1)
    base, stage = _pair(rng, 200, 50, 0.3)
    true = np.mean([_exact_kl(p, q) for p, q in zip(base, stage, strict=True)])
    estimate = np.mean([position_kl(_top(p, 20), _top(q, 20), 20)
                        for p, q in zip(base, stage, strict=True)])
    assert 0.8 * true <= estimate <= 1.1 * true


def test_identical_runs_have_zero_kl_and_full_agreement(tmp_path):
    rng = np.random.default_rng(2)
    base, _ = _pair(rng, 150, 30, 0.0)
    texts = {"a": [_top(p, 5) for p in base[:70]], "b": [_top(p, 5) for p in base[70:]]}
    paired = paired_tokens(_file(tmp_path / "s", texts, 5), _file(tmp_path / "b", texts, 5),
                           tmp_path / "b")
    assert (paired.spans, paired.span_tokens, paired.top_k) == (["a", "b"], [70, 80], 5)
    assert not paired.values("kl").any() and paired.values("top1_agree").all()
    assert not paired.values("nll_diff_vs_baseline").any()
    assert not paired.values("nll_diff_vs_parent").any()
    div, vs_baseline, vs_parent = summaries(paired)
    assert div.tokens == 150 and div.top_k == 5
    assert div.mean_kl == 0.0 and div.top1_agreement == 1.0
    assert vs_baseline.ratio == vs_parent.ratio == 1.0


def test_bigger_change_bigger_kl_per_token(tmp_path):
    rng = np.random.default_rng(3)
    results = []
    for noise in (0.2, 1.0):
        base, stage = _pair(rng, 400, 40, noise)
        b = _file(tmp_path / f"b{noise}", {"t": [_top(p, 20) for p in base]}, 20)
        s = _file(tmp_path / f"s{noise}", {"t": [_top(q, 20) for q in stage]}, 20)
        results.append(paired_tokens(s / LOGPROBS_FILE, b))
        kl = results[-1].values("kl")
        assert kl.size == 400 and (kl >= 0).all() and kl.mean() == pytest.approx(
            np.mean([position_kl(_top(p, 20), _top(q, 20), 20) for p, q in zip(base, stage, strict=True)]),
            rel=1e-5)
    small, large = (summaries(paired)[0] for paired in results)
    assert small.mean_kl < large.mean_kl
    assert small.top1_agreement > large.top1_agreement
    assert results[0].nll_diff_vs_parent is None  # no parent given


def test_different_tokenization_is_refused(tmp_path):
    tops = [{"token_id:1": -0.1}, {"token_id:2": -0.2}]
    base = _file(tmp_path / "b", {"t": tops}, 5, tokens={"t": ["token_id:1", "token_id:2"]})
    stage = _file(tmp_path / "s", {"t": tops}, 5, tokens={"t": ["token_id:1", "token_id:3"]})
    with pytest.raises(MeasurementError, match="'t' tokenized differently at position 1"):
        divergence(stage, base)


def test_different_texts_are_refused(tmp_path):
    tops = [{"token_id:1": -0.1}]
    with pytest.raises(MeasurementError, match="different corpus texts"):
        divergence(_file(tmp_path / "s", {"x": tops}, 5), _file(tmp_path / "b", {"y": tops}, 5))


def test_missing_file_is_a_measurement_error(tmp_path):
    with pytest.raises(MeasurementError, match="cannot read per-position logprobs"):
        divergence(tmp_path / "nope", tmp_path / "nope")


def _scored(path, logprobs: list[float]):
    tops = [{f"token_id:{i}": lp} for i, lp in enumerate(logprobs)]
    payload = {"model": "m", "top_logprobs": 1, "texts": {"t": {
        "tokens": [f"token_id:{i}" for i in range(len(tops))],
        "logprobs": logprobs, "top": tops}}}
    path.mkdir(parents=True, exist_ok=True)
    (path / LOGPROBS_FILE).write_text(json.dumps(payload))
    return path


def test_perplexity_ratio_is_paired_per_token(tmp_path):
    rng = np.random.default_rng(4)
    base = rng.normal(-3.0, 1.5, 600)  # hard and easy tokens: big spread the pairing removes
    same = perplexity_ratio(_scored(tmp_path / "a", list(base)), _scored(tmp_path / "b", list(base)))
    assert (same.ratio, same.tokens) == (1.0, 600)
    worse = base - 0.05 + rng.normal(0, 0.02, 600)  # ~ +5 % perplexity, small per-token noise
    paired = perplexity_ratio(_scored(tmp_path / "w", list(worse)), tmp_path / "b")
    expected = math.exp(float(np.mean(base - worse)))
    assert paired.ratio == pytest.approx(expected)
    better = perplexity_ratio(tmp_path / "b", tmp_path / "w")
    assert better.ratio == pytest.approx(1 / paired.ratio)
    stored = paired_tokens(tmp_path / "w", tmp_path / "b", tmp_path / "a").values("nll_diff_vs_parent")
    assert stored == pytest.approx(base - worse, abs=1e-6)  # stage - parent NLL, per token (float32)


def test_a_parent_scored_on_other_texts_leaves_only_the_parent_series_empty(tmp_path):
    tops = [{"token_id:1": -0.1}, {"token_id:2": -0.2}]
    stage = _file(tmp_path / "s", {"t": tops}, 5)
    base = _file(tmp_path / "b", {"t": tops}, 5)
    parent = _file(tmp_path / "p", {"other": tops}, 5)
    paired = paired_tokens(stage, base, parent)
    assert paired.nll_diff_vs_parent is None and paired.values("kl") is not None
    assert divergence(stage, base).tokens == 2


def test_older_runs_plain_logprobs_files_are_read(tmp_path):
    from evalsets.perplexity import LEGACY_LOGPROBS_FILE

    tops = [{"token_id:1": -0.1}, {"token_id:2": -0.2}]
    _file(tmp_path / "s", {"t": tops}, 5)
    old = _file(tmp_path / "b", {"t": tops}, 5)
    (old / LOGPROBS_FILE).rename(old / LEGACY_LOGPROBS_FILE)
    assert divergence(tmp_path / "s", old).tokens == 2
