"""Synthetic stage records for gate tests: scores, lengths, latencies and divergence we control."""

from __future__ import annotations

import math

import numpy as np

from evalsets.results import Divergence, PairedTokens, QualityItem, QualityResult, TaskQuality
from gates.comparability import Comparability, SetSettings
from gates.record import StageRecord
from infra.engine import EngineFacts
from load.results import LoadResult, LoadSample, LoadSummary, PairedLoad, PairedRound

UNQUANTIZED = {"weights": "none", "activations": "none", "kv_cache": "auto"}


def summary(level: str, tpot: float = 25.0, ttft: float = 80.0, errors: int = 0) -> LoadSummary:
    return LoadSummary(
        level=level, users=1 if level == "low" else 8, requests=100, errors=errors,
        error_rate=errors / 100, duration_s=30, requests_per_s=3.3, output_tokens_per_s=200,
        ttft_p50_ms=ttft, tpot_p50_ms=tpot,
    )


def samples(tpot: float, ttft: float, n: int = 60, seed: int = 0) -> list[LoadSample]:
    """Requests with lognormal noise (~10 %) around the given medians."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        first = ttft * float(rng.lognormal(0, 0.1))
        per_token = tpot * float(rng.lognormal(0, 0.1))
        out.append(LoadSample(start_s=1000.0 + i, ttft_ms=first, e2e_ms=first + 31 * per_token,
                              output_tokens=32, itl_ms=[per_token] * 31))
    return out


def paired(
    reference: str,
    ratio: float = 1.0,
    ttft_ratio: float = 1.0,
    rounds: int = 3,
    drift: float = 0.15,
    noise: float = 0.05,
    requests: int = 6,
    tpot: float = 25.0,
    ttft: float = 80.0,
    seed: int = 0,
) -> PairedLoad:
    """Interleaved rounds against `reference`: the stage is `ratio` x the reference's TPOT.

    Each round shares one lognormal drift factor (sigma `drift`) between both sides, as two
    engines timed back to back on a shared machine do; requests add lognormal `noise`.
    """
    rng = np.random.default_rng(seed)

    def side(per_token: float, first: float, start: float) -> list[LoadSample]:
        out = []
        for i in range(requests):
            f = first * float(rng.lognormal(0, noise))
            t = per_token * float(rng.lognormal(0, noise))
            out.append(LoadSample(start_s=start + i, ttft_ms=f, e2e_ms=f + 31 * t,
                                  output_tokens=32, itl_ms=[t] * 31))
        return out

    levels = {}
    for level in ("low", "high"):
        rows = []
        for index in range(rounds):
            factor = float(rng.lognormal(0, drift))
            rows.append(PairedRound(
                index=index, first="reference" if index % 2 == 0 else "stage",
                reference=side(tpot * factor, ttft * factor, 1000.0 * index),
                stage=side(tpot * factor * ratio, ttft * factor * ttft_ratio, 1000.0 * index + 500),
            ))
        levels[level] = rows
    return PairedLoad(reference=reference, requests_per_round=requests, rounds=levels)


def paired_tokens(kl: float | None, top1: float, log_ratio: float, parent_log_ratio: float,
                  texts: int = 40, per_text: int = 100, seed: int = 0) -> PairedTokens:
    """Per-token values vs the baseline and the parent: KL ~ exponential(kl), top-1 agreement at
    rate top1 (both left out when kl is None), NLL differences (stage - reference) around the log
    perplexity ratios. The point estimates are exactly the ones asked for."""
    rng = np.random.default_rng(seed)
    n = texts * per_text
    spread = rng.exponential(1.0, n)
    noise = rng.normal(0, 0.05, n)
    noise -= noise.mean()
    return PairedTokens.from_values(
        20, [(f"text{i}", per_text) for i in range(texts)],
        kl=None if kl is None else kl * spread / spread.mean(),
        top1_agree=None if kl is None else rng.permutation(np.arange(n) < round(top1 * n)),
        nll_diff_vs_baseline=log_ratio + noise, nll_diff_vs_parent=parent_log_ratio + noise,
    )


def record(
    name: str,
    parent: str | None,
    scores: list[float],
    lengths: list[int] | None = None,
    perplexity: float = 10.0,
    tpot: float = 25.0,
    errors: int = 0,
    kind: str = "weights",
    axes: dict[str, str] | None = None,
    kl: float | None = 0.002,
    top1: float = 0.99,
    groups: list[str] | None = None,
    finish: list[str] | None = None,
    raw_samples: bool = False,
    ttft: float = 80.0,
    paired_load: PairedLoad | None = None,
    parent_perplexity: float | None = None,
) -> StageRecord:
    """A stage with one set 'math'; a non-baseline stage gets per-token divergence values (KL and
    top-1 unless kl is None) and NLL differences. The baseline's perplexity is 10.0; the parent's
    is `parent_perplexity` (default: 10.0 for the baseline, else the stage's own: no change)."""
    lengths = lengths or [40] * len(scores)
    items = [
        QualityItem(id=str(i), prompt_hash="h", response=f"{name} answer {i}", score=s,
                    output_tokens=n, group=groups[i] if groups else None,
                    finish_reason=finish[i] if finish else "stop")
        for i, (s, n) in enumerate(zip(scores, lengths, strict=True))
    ]
    divergence = paired = None
    if parent is not None:
        if kl is not None:
            divergence = Divergence(tokens=4000, mean_kl=kl, top1_agreement=top1)
        if parent_perplexity is None:
            parent_perplexity = 10.0 if parent == "baseline" else perplexity
        paired = paired_tokens(kl, top1, math.log(perplexity / 10.0),
                               math.log(perplexity / parent_perplexity))
    quality = QualityResult(
        tasks={"math": TaskQuality(task="math", metric="accuracy", value=sum(scores) / len(scores),
                                   items=items)},
        perplexity=perplexity, divergence=divergence, paired_tokens=paired,
    )
    load = LoadResult(
        summaries={lvl: summary(lvl, tpot, ttft, errors=errors) for lvl in ("low", "high")},
        samples={lvl: samples(tpot * (1.3 if lvl == "high" else 1), ttft, seed=hash(name) % 1000)
                 for lvl in ("low", "high")} if raw_samples else {},
    )
    facts = EngineFacts(base_url="http://x", model=name, command=["vllm", "--model", name],
                        kv_cache_tokens=100_000, weight_bytes=270_000_000)
    return StageRecord(
        name=name, kind="baseline" if parent is None else kind, parent=parent,
        axes=axes or dict(UNQUANTIZED), facts=facts, quality=quality, load=load,
        fingerprint=f"fp-{name}", paired_load=paired_load, comparability=asked_as(len(scores)),
    )


def asked_as(items: int) -> Comparability:
    """What every synthetic stage was served and sent: the same template, tokenizer, settings."""
    return Comparability(chat_template="a" * 16, tokenizer="b" * 16, load_profile="c" * 16,
                         load_prompts="random token ids, 128 per prompt",
                         sets={"math": SetSettings(generation={"max_gen_toks": 256}, items=items)})


def chain(n: int = 120) -> list[StageRecord]:
    """A realistic 3-stage chain: baseline -> int8 weights (emulated) -> W8A8, with long-context
    buckets, finish reasons, raw latency samples, a few balanced flips and small length changes."""
    rng = np.random.default_rng(7)
    base = [float(x) for x in rng.random(n) < 0.35]
    groups = [("1k", "2k", "4k", "8k")[i % 4] for i in range(n)]
    lengths = [int(x) for x in rng.integers(20, 90, n)]

    def flip(scores: list[float], down: list[int], up: list[int]) -> list[float]:
        out = list(scores)
        for i in down:
            out[i] = 0.0
        for i in up:
            out[i] = 1.0
        return out

    correct = [i for i, s in enumerate(base) if s]
    wrong = [i for i, s in enumerate(base) if not s]
    w8_scores = flip(base, correct[:2], wrong[:2])
    a8_scores = flip(w8_scores, correct[2:4], wrong[2:3])
    jitter = [max(1, n_ + int(rng.integers(-2, 3))) for n_ in lengths]
    finish = ["length" if n_ >= 88 else "stop" for n_ in lengths]
    common = {"groups": groups, "raw_samples": True}
    stages = [
        record("baseline", None, base, lengths, finish=finish, **common),
        record("w8", "baseline", w8_scores, jitter, perplexity=10.1, kl=0.004, top1=0.985,
               axes=UNQUANTIZED | {"weights": "int8/channel"}, finish=finish, **common),
        record("a8", "w8", a8_scores, jitter, perplexity=10.2, kl=0.009, top1=0.975, tpot=21.0,
               kind="activations", finish=finish, parent_perplexity=10.1,
               axes=UNQUANTIZED | {"weights": "int8/channel", "activations": "int8/token/dynamic"},
               **common),
    ]
    stages[1].emulated = True
    stages[2].facts.weight_bytes = 150_000_000
    # As the flow times it: against the baseline (w8 is emulated), in interleaved rounds.
    stages[2].paired_load = paired("baseline", ratio=21.0 / 25.0, seed=7)
    return stages
